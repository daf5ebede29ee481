# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import accuracy


@pytest.mark.parametrize("content,answer", [
    # Kimi behind --reasoning-parser: the reasoning is apart, the content states the result
    ("\n\nThe answer is **7118**.", "7118"),
    # a server without a reasoning parser leaves the reasoning in the content; the numbers in it are not the answer
    ("<think>336 + 6782: 300 + 6700 = 7000, 36 + 82 = 118, so 7118? Let me check 7000.</think>\n\n7118", "7118"),
    # Kimi's own reasoning markers
    (u"\u25c1think\u25b7Let me compute 92*61 = 5612, or 5611?\u25c1/think\u25b7The result is 5612.", "5612"),
    ("So the final answer is $\\boxed{1,285}$. (Checked: 1285 + 1836 = 3121.)", "1285"),
    (u"答案是：16743。", "16743"),
    ("Final answer: -1285", "-1285"),
    ("6396.0", "6396"),
    ("78 * 82 = 6396", "6396"),
])
def test_the_final_answer_comes_after_the_reasoning(content, answer):
    assert accuracy.extract_answer(content) == answer


@pytest.mark.parametrize("content", [
    "<think>Let me compute 78*82. 78*80 = 6240, plus", "I cannot help with that.", "", None,
    u"的 of ]] 血 。。 ## <unk> tens 零 ,, 0x ?? 了 _ a the 亿"])
def test_no_final_answer_is_unparsed_not_a_number_from_the_reasoning(content):
    """max_tokens cut inside the reasoning, a refusal, garbage: no answer (an unparsed sample, not a wrong one)."""
    assert accuracy.extract_answer(content) is None


def test_samples_are_accounted_and_every_planned_item_scores():
    items = [{"id": "g%d" % i, "question": "q", "answer": "1,000" if i == 0 else str(i)} for i in range(8)]
    results = {"g0": {"status": "ok", "answer": "1000"}, "g1": {"status": "ok", "answer": "1"},
               "g2": {"status": "ok", "answer": "7"}, "g3": {"status": "ok", "answer": None},
               "g4": {"status": "failed", "answer": None}, "g5": {"status": "ok", "answer": "5"}}
    assert accuracy.account(items, results) == {
        "total": 8, "completed": 5, "failed": 1, "missing": 2, "unparsed": 1, "correct": 3, "wrong": 1, "score": 37.5}
    assert accuracy.account([], {})["score"] == 0.0


def test_the_pass_rule_is_vllm_ascends_absolute_threshold_either_way():
    assert accuracy.passes(96.88, 100.0, 5)   # two of 64 wrong
    assert not accuracy.passes(93.75, 100.0, 5)  # four of 64 wrong
    assert accuracy.passes(80.1, 75.0, 5.1) and not accuracy.passes(80.2, 75.0, 5.1)  # above the baseline too


def test_tool_arguments_are_checked_against_the_tools_schema():
    schema = accuracy.TOOL["function"]["parameters"]
    assert accuracy.schema_problems(schema, {"city": "Beijing"}) == []
    assert accuracy.schema_problems(schema, {}) == ["arguments: required 'city' is missing"]
    assert accuracy.schema_problems(schema, {"city": 3, "unit": "c"}) == [
        "arguments.city: 3 is not of type string", "arguments: 'unit' is not a property of the tool"]
    assert accuracy.schema_problems({"type": "integer"}, 2.5) == ["arguments: 2.5 is not an integer"]
    assert accuracy.schema_problems({"type": "string", "enum": ["c", "f"]}, "k") == [
        "arguments: 'k' is not one of ['c', 'f']"]


class Script(object):
    """A client that answers from a table, the way the golden set's requests reach it."""
    timeout = 5

    def __init__(self, answers):
        self.answers = answers

    def post(self, path, body):
        q = body["messages"][0]["content"]
        reply = self.answers[q]
        if isinstance(reply, Exception):
            raise reply
        return {"choices": [{"message": {"content": reply, "reasoning": "thinking"}}]}, 0.01


def test_the_golden_set_is_asked_greedy_and_failures_are_failed_samples():
    items = [{"id": "a", "question": "What is 2 + 2?", "answer": "4"},
             {"id": "b", "question": "What is 3 * 3?", "answer": "9"},
             {"id": "c", "question": "What is 5 - 7?", "answer": "-2"}]
    client = Script({"What is 2 + 2?": "4", "What is 3 * 3?": "The answer is 6.",
                     "What is 5 - 7?": accuracy.ApiError("HTTP 500: boom", 500)})
    results = accuracy.ask_golden(client, "m", items, concurrency=2)
    assert results["a"]["answer"] == "4" and results["b"]["answer"] == "6"
    assert results["c"] == {"status": "failed", "answer": None, "detail": "HTTP 500: boom"}
    assert accuracy.account(items, results)["score"] == 33.33


def test_what_lm_eval_wrote_is_read_back_with_its_samples_accounted():
    """lm-eval 0.4.13's results file and logged samples (their shape, as it writes them for a generate_until task
    with a regex filter): a correct sample, a wrong one, one whose filter found nothing, one with no response."""
    results = {"results": {"npuops_arith": {"name": "npuops_arith", "alias": "npuops_arith", "sample_len": 5,
                                            "exact_match,last_number": 0.4,
                                            "exact_match_stderr,last_number": 0.2449}},
               "n-samples": {"npuops_arith": {"original": 5, "effective": 5}}}
    samples = {"npuops_arith": [
        {"doc_id": 0, "target": "42", "resps": [["12+30=42."]], "filtered_resps": ["42"], "exact_match": 1.0},
        {"doc_id": 1, "target": "56", "resps": [["7*8=54."]], "filtered_resps": ["54"], "exact_match": 0.0},
        {"doc_id": 2, "target": "99", "resps": [["I do not know."]], "filtered_resps": ["[invalid]"],
         "exact_match": 0.0},
        {"doc_id": 3, "target": "42", "resps": [[""]], "filtered_resps": ["[invalid]"], "exact_match": 0.0},
        {"doc_id": 4, "target": "7", "resps": [["So 7."]], "filtered_resps": ["7"], "exact_match": 1.0}]}
    assert accuracy.lm_eval_account(results, samples) == {"npuops_arith": {
        "metric": "exact_match,last_number", "score": 40.0, "samples": {
            "total": 5, "completed": 4, "failed": 1, "missing": 0, "unparsed": 1, "correct": 2, "wrong": 1,
            "score": 40.0}}}
    samples["npuops_arith"] = samples["npuops_arith"][:3]  # two never logged: missing
    assert accuracy.lm_eval_account(results, samples)["npuops_arith"]["samples"]["missing"] == 2


def test_lm_eval_runs_offline_with_the_key_out_of_its_command_line():
    argv = accuracy.lm_eval_argv("/opt/lm/bin/lm_eval", "http://10.0.0.11:8000/", "kimi-k3", ["a", "b"], "/srv/tasks",
                                 "/srv/out", limit=8, concurrency=2)
    assert argv == ["/opt/lm/bin/lm_eval", "run", "--model", "local-chat-completions", "--model_args",
                    "model=kimi-k3,base_url=http://10.0.0.11:8000/v1/chat/completions,num_concurrent=2,max_retries=2,"
                    "tokenized_requests=False,tokenizer_backend=None", "--tasks", "a,b", "--include_path", "/srv/tasks",
                    "--output_path", "/srv/out", "--log_samples", "--apply_chat_template", "--limit", "8"]
    assert accuracy.OFFLINE_ENV["HF_DATASETS_OFFLINE"] == "1"
    assert accuracy.task_data_files([{"dataset_path": "json", "dataset_kwargs": {"data_files": {
        "test": "/srv/a.jsonl", "dev": ["/srv/b.jsonl"]}}}, {"dataset_path": "/srv/local_ds"}]) == [
        "/srv/a.jsonl", "/srv/b.jsonl", "/srv/local_ds"]
