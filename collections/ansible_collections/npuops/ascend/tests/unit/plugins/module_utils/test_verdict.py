# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import verdict

SPEC = {"image": "quay.io/ascend/vllm-ascend:v0.23.0-a3", "command": ["vllm", "serve", "/m", "--max-num-seqs", "16"],
        "env": {"HCCL_BUFFSIZE": "800"}, "secret_env": {"VLLM_API_KEY": "hmac-sha256:1111"}, "labels": {}}


def test_a_configuration_is_what_every_engine_runs_where_it_runs_whatever_the_key():
    a = verdict.config_id({"node01": SPEC, "node02": dict(SPEC, command=SPEC["command"] + ["--headless"])})
    assert a.startswith("cfg-") and len(a) == 24
    # the same specs give the same id; a new API key (its digest) changes no answer, so not the configuration
    assert verdict.config_id({"node02": dict(SPEC, command=SPEC["command"] + ["--headless"]),
                              "node01": dict(SPEC, secret_env={"VLLM_API_KEY": "hmac-sha256:2222"})}) == a
    # a flag, an environment value, a host: another configuration
    assert verdict.config_id({"node01": dict(SPEC, command=SPEC["command"][:-1] + ["32"]),
                              "node02": dict(SPEC, command=SPEC["command"] + ["--headless"])}) != a
    assert verdict.config_id({"node01": dict(SPEC, env={"HCCL_BUFFSIZE": "1024"}),
                              "node02": dict(SPEC, command=SPEC["command"] + ["--headless"])}) != a
    assert verdict.config_id({"node03": SPEC, "node02": dict(SPEC, command=SPEC["command"] + ["--headless"])}) != a
    # an engine npuops did not make, or that is gone: no configuration to judge
    assert verdict.config_id({"node01": SPEC, "node02": None}) is None
    assert verdict.config_id({}) is None


def test_a_verdict_lasts_until_the_same_configuration_is_measured_again():
    doc = verdict.record(None, "a", "cfg-1", "answers", verdict.PASSED, "golden 100.0", "t1",
                         engines={"node01": {"vllm": {"exists": True, "spec": SPEC}}})
    assert verdict.gate_state(doc, "cfg-1", ["answers"]) == (verdict.PASSED, "answers passed at t1")
    assert doc["last_good"]["config"] == "cfg-1"
    doc = verdict.record(doc, "a", "cfg-2", "answers", verdict.FAILED, "golden 0.00 outside 100 +- 5", "t2")
    state, detail = verdict.gate_state(doc, "cfg-2", ["answers"])
    assert state == verdict.FAILED and detail == ("its running configuration (cfg-2) failed the answers gate at t2: "
                                                  "golden 0.00 outside 100 +- 5")
    assert doc["last_good"]["config"] == "cfg-1"  # cfg-1 is still the last that answered right
    assert verdict.gate_state(doc, "cfg-1", ["answers"])[0] == verdict.PASSED
    assert verdict.gate_state(doc, "cfg-3", ["answers"])[0] == verdict.UNMEASURED
    assert verdict.gate_state(doc, None, ["answers"])[0] == verdict.UNKNOWN
    assert verdict.gate_state(doc, "cfg-3", []) == (verdict.PASSED, "no gate asked")
    # measured again and wrong now: the last good configuration is forgotten
    doc = verdict.record(doc, "a", "cfg-1", "answers", verdict.FAILED, "golden 3.00", "t3")
    assert verdict.gate_state(doc, "cfg-1", ["answers"])[0] == verdict.FAILED and doc["last_good"] is None
    # a gate that never judged it leaves it unmeasured under both gates
    assert verdict.gate_state(doc, "cfg-2", ["answers", "speed"])[0] == verdict.FAILED
    doc = verdict.record(doc, "a", "cfg-4", "answers", verdict.PASSED, "ok", "t4")
    assert verdict.gate_state(doc, "cfg-4", ["answers", "speed"])[0] == verdict.UNMEASURED


def test_a_record_keeps_the_newest_configurations_and_refuses_nonsense():
    doc = None
    for i in range(verdict.KEEP + 3):
        doc = verdict.record(doc, "a", "cfg-%d" % i, "answers", verdict.PASSED, "", "t%d" % i)
    assert doc["order"] == ["cfg-%d" % i for i in range(3, verdict.KEEP + 3)] and len(doc["configs"]) == verdict.KEEP
    with pytest.raises(verdict.VerdictError, match="gate 'latency' is not one of answers, speed"):
        verdict.record(doc, "a", "cfg-1", "latency", verdict.PASSED)
    with pytest.raises(verdict.VerdictError, match="neither passed nor failed"):
        verdict.record(doc, "a", "cfg-1", "answers", "maybe")
    with pytest.raises(verdict.VerdictError, match="cannot name a record file"):
        verdict.path_of("/x", "../etc")


def test_records_are_written_whole_root_only_and_a_broken_one_is_not_forgotten_silently(tmp_path):
    path = verdict.path_of(str(tmp_path / "verdicts"), "a")
    assert verdict.load(path, "a") == verdict.empty("a")
    doc = verdict.record(None, "a", "cfg-1", "answers", verdict.PASSED, "ok", "t1")
    verdict.save(path, doc)
    assert verdict.load(path, "a") == doc
    assert oct(os.stat(path).st_mode & 0o777) == "0o600" and os.listdir(str(tmp_path / "verdicts")) == ["a.json"]
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(verdict.VerdictError, match="is not a verdict record .* remove it to measure the instance again"):
        verdict.load(path, "a")
    with open(path, "w") as f:
        json.dump(["a"], f)
    with pytest.raises(verdict.VerdictError, match="is not a verdict record"):
        verdict.load(path, "a")


def test_the_same_verdict_measured_again_changes_nothing_and_keeps_the_time_it_was_first_given():
    """A re-run of site.yml on an unchanged cluster measures again: the record stays byte for byte what it was (the
    rerun changes nothing, molecule's idempotence), and says since when the verdict holds."""
    engines = {"node01": {"vllm": {"exists": True, "spec": SPEC}}}
    doc = verdict.record(None, "a", "cfg-1", "answers", verdict.PASSED, "golden 100.0", "t1", engines=engines)
    again = verdict.record(json.loads(json.dumps(doc)), "a", "cfg-1", "answers", verdict.PASSED, "golden 100.0",
                           "t2", engines=engines)
    assert again == doc and verdict.gate_state(again, "cfg-1", ["answers"]) == (verdict.PASSED,
                                                                                "answers passed at t1")
    # another score, another verdict or other engines: a new measurement, with its time
    changed = verdict.record(doc, "a", "cfg-1", "answers", verdict.PASSED, "golden 98.4", "t3", engines=engines)
    assert changed["configs"]["cfg-1"]["answers"] == {"verdict": verdict.PASSED, "at": "t3", "detail": "golden 98.4"}
    failed = verdict.record(doc, "a", "cfg-1", "answers", verdict.FAILED, "golden 100.0", "t4")
    assert failed["configs"]["cfg-1"]["answers"]["at"] == "t4" and failed["last_good"] is None
    other = {"node02": {"vllm": {"exists": True, "spec": SPEC}}}
    moved = verdict.record(doc, "a", "cfg-1", "answers", verdict.PASSED, "golden 100.0", "t5", engines=other)
    assert moved["last_good"] == {"config": "cfg-1", "engines": other, "at": "t5"}
