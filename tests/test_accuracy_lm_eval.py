"""The accuracy role drives the real lm-eval (the Language Model Evaluation Harness, tools/lmeval.sh's
.venv-lmeval) against the simulated engine on loopback, with a small local dataset, and reads back what lm-eval
wrote: the score judged against its baseline, the samples accounted; garbled answers fail naming the instance, the
dataset, the score and the baseline; a dataset that is not there fails naming its path, before lm-eval runs."""
import json
import os

import pytest

from npuops_sim.loopback import Loopback
from npuops_sim.testing import BIN, run

pytestmark = pytest.mark.lmeval

ITEMS = [("What is 12 + 30?", "42"), ("Compute 7 * 8.", "56"), ("What is 100 - 1?", "99"),
         ("What is 21 * 2?", "42"), ("Compute 1500 + 2700.", "4200"), ("What is 90 - 135?", "-45"),
         ("What is 13 * 13?", "169"), ("Compute 64 + 64.", "128")]
# a generate_until task as lm-eval's own local-dataset tasks are written: the last number standing alone is the answer
TASK = """task: npuops_arith
dataset_path: json
dataset_kwargs:
  data_files:
    test: %s
test_split: test
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: []
  max_gen_toks: 256
  temperature: 0
  do_sample: false
filter_list:
  - name: last_number
    filter:
      - function: regex
        regex_pattern: "(?<![\\\\w.])(-?[0-9][0-9,]*)(?![\\\\w])"
        group_select: -1
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    lb = Loopback(tmp_path_factory.mktemp("engine"))
    e = lb.engine("--reasoning-parser", "kimi_k3", "--tool-call-parser", "kimi_k3", "--enable-auto-tool-choice")
    e.lb = lb
    yield e
    lb.close()


def tasks_dir(tmp_path, data):
    d = tmp_path / "tasks"
    d.mkdir()
    (d / "npuops_arith.yaml").write_text(TASK % data)
    return str(d)


def accuracy(engine, tmp_path, include_path):
    extra = {"engine_url": engine.url, "npuops_accuracy_checks": [],
             "npuops_accuracy_suites": [{"name": "arith", "tool": "lm_eval", "tasks": ["npuops_arith"],
                                         "include_path": include_path}],
             "npuops_accuracy_lm_eval": os.environ["NPUOPS_LM_EVAL"],
             "npuops_accuracy_output_dir": str(tmp_path / "out"),
             "npuops_accuracy_baselines": {"default": {"npuops_arith": {"baseline": 100.0, "threshold": 5.0}}}}
    f = tmp_path / "vars.json"
    f.write_text(json.dumps(extra))
    proc = run([BIN + "/ansible-playbook", "tests/playbooks/accuracy_suite.yml", "-e", "@%s" % f], check=False,
               timeout=600)
    return proc, " ".join(proc.stdout.split())


def test_lm_eval_scores_the_engine_and_the_role_reads_what_it_wrote(engine, tmp_path):
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in ITEMS))
    proc, text = accuracy(engine, tmp_path, tasks_dir(tmp_path, data))
    assert proc.returncode == 0, text[-3000:]
    assert "main: ok npuops_arith 100.0/100 (baseline 100.0 +- 5.0; 8 of 8 correct, 0 failed, 0 missing, 0 " \
           "unparsed)" in text, text[-3000:]
    # what lm-eval wrote is there, as it wrote it
    results = [os.path.join(d, f) for d, _s, fs in os.walk(str(tmp_path / "out")) for f in fs
               if f.startswith("results_")]
    assert len(results) == 1 and json.load(open(results[0]))["results"]["npuops_arith"][
        "exact_match,last_number"] == 1.0

    # the engine answers junk with HTTP 200 (the simulator's fault garbled, read from its profile per request)
    prof = json.load(open(engine.lb.profile))
    prof["faults"].append({"fault": "garbled"})
    json.dump(prof, open(engine.lb.profile, "w"))
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    try:
        proc, text = accuracy(engine, garbled, tasks_dir(garbled, data))
    finally:
        prof["faults"] = [f for f in prof["faults"] if f["fault"] != "garbled"]
        json.dump(prof, open(engine.lb.profile, "w"))
    assert proc.returncode != 0, text[-3000:]
    assert "Accuracy: instance main: npuops_arith score 0.00 is outside baseline 100.00 +- 5.00 (0 of 8 correct, 0 " \
           "failed, 0 missing, 8 unparsed)" in text, text[-3000:]


def test_a_dataset_that_is_not_there_is_named_before_lm_eval_runs(engine, tmp_path):
    proc, text = accuracy(engine, tmp_path, tasks_dir(tmp_path, "/srv/eval/no-such-gpqa.jsonl"))
    assert proc.returncode != 0
    assert "instance main: suite arith (lm_eval) could not run: the dataset /srv/eval/no-such-gpqa.jsonl is not on " \
           "this host (nothing is downloaded at run time)" in text, text[-3000:]
    assert not (tmp_path / "out").exists() or not any(f.startswith("results_") for _d, _s, fs in
                                                      os.walk(str(tmp_path / "out")) for f in fs)
