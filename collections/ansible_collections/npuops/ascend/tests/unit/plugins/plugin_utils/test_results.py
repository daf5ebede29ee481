# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils import results


def test_each_way_a_registered_result_can_end():
    hv = {"ok": {"r": {"changed": True, "ready_after": 3}},
          "skip": {"r": {"skipped": True}},
          "gone": {"r": {"unreachable": True, "msg": "Failed to connect to the host via ssh: timed out\nmore"}},
          "bad": {"r": {"failed": True, "msg": "container vllm exited with code 1"}},
          "cleared": {"r": {"msg": "did not answer within 300s"}},  # failed_when: false cleared `failed`
          "echo": {"r": {"aborted": True, "msg": "stopped waiting for vllm: bad failed"}},
          "stopped": {"r": {"failed": True, "state": "stopped", "msg": "stopped because gone failed"}},
          "none": {}}
    hosts = ["ok", "skip", "gone", "bad", "cleared", "echo", "stopped", "none"]
    got = results.classify(hv, hosts, "r", done_key="ready_after")
    assert got["causes"] == {"gone": "unreachable (Failed to connect to the host via ssh: timed out)",
                             "bad": "container vllm exited with code 1", "cleared": "did not answer within 300s"}
    assert got["echoes"] == {"echo": "stopped waiting for vllm: bad failed", "stopped": "stopped because gone failed"}
    # without a done key a message alone is no failure (a result may carry a harmless msg)
    assert results.classify(hv, ["cleared"], "r") == {"causes": {}, "echoes": {}}
    assert results.outcome(None) == (results.SKIPPED, None)


def test_the_gate_names_the_causes_first_then_the_hosts_stopped_because_of_them():
    hv = {"n1": {"st": {"state": "done", "files_fetched": 3}},
          "n2": {"st": {"failed": True, "state": "stopped", "msg": "stopped because n3 unreachable: ..."}},
          "n3": {"st": {"unreachable": True, "msg": "Task failed: Failed to connect to the host via ssh: timed out\nmore"}},
          "n4": {"st": {"failed": True, "state": "failed", "msg": "the weight copy failed: disk full"}},
          "n5": {}}
    got = results.gate(hv, ["n1", "n2", "n3", "n4", "n5"], "st", "The weights stage", "copying",
                       "the weight servers and copy jobs of this run were stopped on every reachable host")
    assert got["hosts"] == ["n3", "n4"]
    assert got["message"].splitlines() == [
        "The weights stage failed (copying) on 2 host(s); the weight servers and copy jobs of this run were stopped on "
        "every reachable host:",
        "- n3: unreachable (Task failed: Failed to connect to the host via ssh: timed out)",
        "- n4: the weight copy failed: disk full",
        "- n2: stopped because n3 unreachable: ..."]
    # with no cause left (the failing host's own result is missing), the stopped ones are named
    assert results.gate({"n2": hv["n2"]}, ["n2"], "st", "S", "s", "u")["hosts"] == ["n2"]
    # nothing failed: no hosts, no message
    assert results.gate(hv, ["n1", "n5"], "st", "S", "s", "u") == {"hosts": [], "message": ""}


def test_the_gate_reads_waits_registered_with_failed_when_false_by_their_done_key():
    hv = {"a": {"r": {"changed": False, "failed": False, "msg": "vllm: exited with code 1"}},
          "b": {"r": {"changed": False, "ready_after": 3.0}},
          "c": {"r": {"skipped": True, "msg": "x"}},
          "d": {"r": {"unreachable": True, "msg": "ssh: connect timed out"}},
          "e": {"r": {"aborted": True, "msg": "stopped waiting for vllm: a failed"}}}
    got = results.gate(hv, ["e", "a", "b", "c", "d"], "r", "The deployment", "the engines coming up",
                       "the engines this run started that had not come up were stopped", done_key="ready_after")
    assert got["hosts"] == ["a", "d"]
    assert got["message"].splitlines()[1:] == [
        "- a: vllm: exited with code 1", "- d: unreachable (ssh: connect timed out)",
        "- e: stopped waiting for vllm: a failed"]
