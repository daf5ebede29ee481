# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.filter import outcome


def test_rollout_outcome_names_every_stage_and_none_for_those_not_run():
    plan = {"endpoint": "http://10.0.0.1:8000", "tier": "2node_pp", "hosts": {"b": {}, "a": {}},
            "instances": {"main": {"endpoint": "http://10.0.0.1:8000", "hosts": ["a", "b"],
                                   "served_model_name": "kimi-k3", "recipe": "gpuworks_kimi_k3_1_pro_2node_a3",
                                   "model": {"model": "kimi_k3_w4a8", "model_dir": "/data/k3", "tokenizer_dir": ""}}}}
    out = outcome.rollout_outcome(plan, {"served_model_name": "kimi-k3"}, {
        "preflight": {"ok": True, "go": True, "failures": [], "table": ["x"]},
        "validate": {"ok": True, "checks": [{"name": "chat", "ok": True}]},
        "deploy": {"restart": ["main/main"], "lines": ["a (create): (all)"]}, "weights": None})
    assert out["ok"] and out["endpoint"] == "http://10.0.0.1:8000" and out["nodes"] == ["a", "b"]
    assert out["instances"] == {"main": {"endpoint": "http://10.0.0.1:8000", "hosts": ["a", "b"], "model": {
        "served_model_name": "kimi-k3", "preset": "kimi_k3_w4a8", "model_dir": "/data/k3",
        "recipe": "gpuworks_kimi_k3_1_pro_2node_a3", "draft": None, "num_speculative_tokens": None}}}
    assert out["preflight"] == {"ok": True, "go": True, "failures": []}
    assert out["deploy"] == {"restarted": ["main/main"], "changes": ["a (create): (all)"]}
    assert out["weights"] is None and out["bench"] is None and out["bench_report"] is None
    assert out["recipe"] is None and out["images"] == {}
    held = {"image": "q/v:kimi-k3-a3", "present": True, "id": "i", "digest": "sha256:d", "error": None,
            "versions": {"vllm": "0.23.0", "vllm_ascend": "0.23.0", "torch_npu": "t", "torch": "t", "cann": "9.1.0"}}
    out = outcome.rollout_outcome(plan, {}, {"recipe": "kimi_k3_tutorial_4node_a3", "preflight": {
        "ok": True, "go": True, "failures": [], "images": {"a": held, "b": dict(held, present=False)}}})
    assert out["recipe"] == "kimi_k3_tutorial_4node_a3"
    assert out["images"] == {"a": {"image": "q/v:kimi-k3-a3", "id": "i", "digest": "sha256:d",
                                   "versions": held["versions"]}}
    failed = outcome.rollout_outcome(plan, {}, {"failed": {"task": "Stop before the weight load", "msg": "m"}})
    assert failed["ok"] is False and failed["failed"]["task"].startswith("Stop")


def test_the_failure_names_the_hosts_that_failed_not_those_stopped_because_of_them():
    hv = {"a": {"f": None}, "b": {"f": {"task": "Pull the weights", "msg": "checksum of x differs"}},
          "c": {"f": {"task": "Pull the weights", "msg": "c: unreachable"}}}
    got = outcome.site_failures(hv, ["a", "b", "c"], "f")
    assert got == {"task": "Pull the weights", "hosts": [
        {"host": "b", "task": "Pull the weights", "msg": "checksum of x differs"},
        {"host": "c", "task": "Pull the weights", "msg": "c: unreachable"}],
        "msg": "b: checksum of x differs; c: unreachable"}
    assert outcome.site_failures({"a": {}}, ["a"], "f") is None


def test_unreachable_hosts_are_named_with_why():
    hv = {"a": {"r": {"ping": "pong"}}, "b": {"r": {"unreachable": True, "msg": "Failed to connect\nssh: timed out"}}}
    assert outcome.unreachable_hosts(hv, ["a", "b"], "r") == ["b: ssh: timed out"]


def test_the_weights_outcome_reports_the_tokenizer_copy_apart():
    plan = {"endpoint": "http://10.0.0.1:8000", "tier": "4node_dp", "hosts": {"a": {}, "b": {}}, "instances": {}}
    report = {"seed": "a", "run_id": "r1", "files": [{"path": "m.safetensors"}], "total_bytes": 1000,
              "receivers": [], "tokenizer": {"dir": "/data/tok", "files": [{"path": "t.json"}, {"path": "t.model"}],
                                             "total_bytes": "30", "receivers": ["b"], "nodes": {}}}
    got = outcome.rollout_outcome(plan, {}, {"weights": report})["weights"]
    assert got == {"seed": "a", "total_bytes": 1000, "files": 1, "copied_to": [],
                   "tokenizer": {"seed": "a", "dir": "/data/tok", "total_bytes": 30, "files": 2, "copied_to": ["b"]}}
    del report["tokenizer"]
    assert "tokenizer" not in outcome.rollout_outcome(plan, {}, {"weights": report})["weights"]
