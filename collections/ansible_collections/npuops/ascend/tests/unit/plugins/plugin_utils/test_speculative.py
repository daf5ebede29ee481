# -*- coding: utf-8 -*-
"""The draft presets and the rules a plan with a draft keeps (plugin_utils/speculative.py), and what the capacity plan
counts of a draft."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest
import yaml

from ansible_collections.npuops.ascend.plugins.filter import capacity
from ansible_collections.npuops.ascend.plugins.plugin_utils import speculative

PRESETS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "defaults", "defaults", "main",
                       "presets.yml")


def load():
    with open(PRESETS) as f:
        data = yaml.safe_load(f)
    return data["npuops_draft_presets"], data["npuops_model_presets"]


TP16 = [{"name": "main", "tp": 16}]
PD = [{"name": "prefill", "tp": 16, "kv_role": "kv_producer"}, {"name": "decode", "tp": 16, "kv_role": "kv_consumer"}]


def test_each_tutorial_draft_renders_its_section_5_2_config():
    drafts, _models = load()
    for name, tokens in (("radixark_kimi_k3_dspark", 7), ("inferact_kimi_k3_dspark", 7),
                         ("inferact_kimi_k3_dspark_block5", 5)):
        draft = speculative.draft_spec(drafts, name, {}, "/d")
        assert speculative.problems(draft, 133120, TP16) == []
        assert speculative.config(draft, 16) == {"method": "dspark", "model": "/d", "num_speculative_tokens": tokens,
                                                 "draft_tensor_parallel_size": 16, "max_model_len": 4096,
                                                 "draft_sample_method": "greedy", "enforce_eager": True}


@pytest.mark.parametrize("overrides, groups, expected", [
    ({"num_speculative_tokens": 0}, TP16, ["num_speculative_tokens = 0: vLLM requires it to be greater than zero"]),
    ({"num_speculative_tokens": 15}, TP16, []),
    ({"num_speculative_tokens": 16}, TP16, ["1 + k = 17 query tokens per request exceed the 16"]),
    ({"num_speculative_tokens": 3}, TP16, ["a DSpark draft proposes a block of at least 5 tokens"]),
    ({"draft_tensor_parallel_size": 1}, TP16, []),
    ({"draft_tensor_parallel_size": 8}, TP16, ["draft_tensor_parallel_size 8 on group main (TP16): vLLM takes 1 or"]),
    ({"max_model_len": 133120}, TP16, []),
    ({"max_model_len": 133121}, TP16, ["max_model_len 133121 is larger than the target's 133120"]),
    ({}, PD, []),
    ({"prefill_num_speculative_tokens": 1}, PD, ["with DSpark both sides use the same number"]),
    ({"method": "eagle3"}, PD, []),
    ({"method": "eagle3", "prefill_num_speculative_tokens": 7}, PD,
     ["the prefill side runs 1 speculative token with eagle3"]),
])
def test_the_rules_each_name_what_they_refuse(overrides, groups, expected):
    drafts, _models = load()
    draft = speculative.draft_spec(drafts, "inferact_kimi_k3_dspark", overrides, "/d")
    got = speculative.problems(draft, 133120, groups)
    assert len(got) == len(expected) and all(e in g for e, g in zip(expected, got)), got


def test_prefill_runs_dspark_k_and_other_methods_one():
    drafts, _models = load()
    draft = speculative.draft_spec(drafts, "inferact_kimi_k3_dspark_block5", {}, "/d")
    assert speculative.config(draft, 16, "kv_producer")["num_speculative_tokens"] == 5
    eagle = dict(draft, method="eagle3")
    assert speculative.config(eagle, 16, "kv_producer")["num_speculative_tokens"] == 1
    assert speculative.config(eagle, 16, "kv_consumer")["num_speculative_tokens"] == 5


def test_unknown_draft_or_field_is_named_with_the_known_ones():
    drafts, _models = load()
    with pytest.raises(speculative.DraftError, match="npuops_draft = 'dspark' is not a draft preset; use one of "
                                                     "inferact_kimi_k3_dspark, inferact_kimi_k3_dspark_block5"):
        speculative.draft_spec(drafts, "dspark")
    with pytest.raises(speculative.DraftError, match="'k' is not a field of draft preset"):
        speculative.draft_spec(drafts, "inferact_kimi_k3_dspark", {"k": 5})
    with pytest.raises(speculative.DraftError, match="num_speculative_tokens = 'five'"):
        speculative.draft_spec(drafts, "inferact_kimi_k3_dspark", {"num_speculative_tokens": "five"})
    assert speculative.draft_spec(drafts, "inferact_kimi_k3_dspark", {"num_speculative_tokens": "5"})[
        "num_speculative_tokens"] == 5


def test_the_capacity_plan_counts_the_drafts_weights_and_kv_per_die():
    """8 GB of draft over TP16 is 0.5 GB per die less KV budget; each token carries the draft's 5 MLA layers of 576
    bf16 elements as well (5760 bytes beside the target's 61 x 576 int8)."""
    drafts, models = load()
    target = models["kimi_k3_w4a8"]
    draft = speculative.draft_spec(drafts, "inferact_kimi_k3_dspark", {}, "/d")
    plain = capacity.plan(target, 16, 1, 4, True)
    drafted = capacity.plan(dict(target, draft=draft), 16, 1, 4, True)
    assert plain["kv_bytes_per_token_per_die"] == 61 * 576 and drafted["kv_bytes_per_token_per_die"] == 61 * 576 + 5760
    assert round(drafted["weights_bytes_per_die"] - plain["weights_bytes_per_die"]) == 500000000
    budget = plain["kv_budget_gib_per_die"] * 1024 ** 3 - 500000000
    # the budget is read back from its GiB figure, rounded to 0.01 GiB: about 130 tokens either way
    assert abs(drafted["kv_tokens"] - budget / (61 * 576 + 5760)) < 200
    assert drafted["kv_tokens"] < plain["kv_tokens"] and drafted["draft_gib_per_die"] == 0.47
