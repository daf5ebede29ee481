# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.filter import weights


def test_the_chain_starts_at_the_seed_and_falls_back_towards_it():
    chain = weights.weights_chain(["n1", "n2", "n3", "n4"], "n2")
    assert chain == ["n2", "n1", "n3", "n4"]
    hv = dict((h, {"npuops_node_ip": "10.0.0.%d" % i, "npuops_fabric_ip": "10.9.0.%d" % i})
              for i, h in enumerate(["n1", "n2", "n3", "n4"], 1))
    hv["n4"].pop("npuops_fabric_ip")
    src = weights.weights_sources(chain, hv, 18090)
    assert src["n2"] == [] and src["n1"] == ["http://10.9.0.2:18090"]
    assert src["n4"] == ["http://10.9.0.3:18090", "http://10.9.0.1:18090", "http://10.9.0.2:18090"]
    assert weights.weights_servers(chain, ["n3"]) == ["n2", "n1"]
    assert weights.weights_servers(chain, []) == []
    with pytest.raises(AnsibleFilterError, match="seed 'n9' is not one of the hosts"):
        weights.weights_chain(["n1"], "n9")


def progress(d):
    return {"content": base64.b64encode(json.dumps(d).encode()).decode()}


def test_progress_lines_and_copy_states():
    hv = {"a": {"npuops_weights_status": {"finished": 0},
                "npuops_weights_progress": progress({"state": "running", "files_done": 3, "files_total": 64,
                                                     "bytes_done": 180e9, "bytes_total": 1500e9, "mb_per_s": 490.1,
                                                     "eta_s": 2700})},
          "b": {"npuops_weights_status": {"finished": 1, "files_total": 64, "files_fetched": 64}},
          "c": {"npuops_weights_status": {"finished": 1, "msg": "model-1: piece 3 ..."}}}
    lines = weights.weights_progress(hv, ["a", "b", "c"])
    assert lines[0] == "a: 3/64 files, 180.0/1500.0 GB, 490.1 MB/s, ETA 45m00s (running)"
    assert lines[1].endswith("(done)") and lines[2].endswith("(failed)")
    assert not weights.weights_done(hv, ["a", "b", "c"])
    assert weights.weights_done(hv, ["a", "b", "c"], active=["b", "c"])  # a dropped out of the play
    assert weights.weights_summary(hv, ["b"])["b"]["files_fetched"] == 64
