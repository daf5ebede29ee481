# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

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


def test_the_projection_is_the_chain_at_the_slower_of_disk_and_link():
    # 1.5 TB, 16 nodes, NVMe 3000 MB/s, 400GbE: the disk bounds; 15 receivers cost one copy plus 14 hops
    p = weights.weights_copy_projection(1500 * 10 ** 9, 16, 3000, 400)
    hop = max(64 * 1024 * 4 / 3e9, 0.02) + 0.016
    assert p["bound"] == "disk write" and p["rate_mb_s"] == 3000.0
    assert p["seconds"] == round(2.0 + 1500e9 / 3e9 + 14 * hop, 1) and "about 8m22s" in p["text"]
    # a slow link bounds instead: 10 Gbit/s carries 10e9 / 8 * 0.94 bytes/s of payload
    slow = weights.weights_copy_projection(10 ** 9, 8, 3000, 10)
    assert slow["bound"] == "link" and slow["rate_mb_s"] == round(10e9 / 8 * 0.94 / 1e6, 1)
    assert weights.weights_copy_projection(10 ** 9, 1, 3000, 10)["seconds"] == 0.0  # nothing to copy
    assert weights.weights_copy_projection(10 ** 9, 4, None, None)["rate_mb_s"] == 3000.0  # the A3 defaults
    with pytest.raises(AnsibleFilterError, match="must be positive"):
        weights.weights_copy_projection(10 ** 9, 4, 0, 400)


def test_the_hub_token_goes_to_the_environment_never_the_command_line():
    argv = weights.weights_download_argv("moonshotai/Kimi-K3", "huggingface", "abc123", "/data/k3")
    assert argv == ["hf", "download", "moonshotai/Kimi-K3", "--revision", "abc123", "--local-dir", "/data/k3"]
    assert weights.weights_hub_env("huggingface", "hf_secret", "http://127.0.0.1:8080") == {
        "HF_TOKEN": "hf_secret", "HF_ENDPOINT": "http://127.0.0.1:8080"}
    assert weights.weights_hub_env("modelscope", "ms-secret", "https://mirror.example:8443/") == {
        "MODELSCOPE_API_TOKEN": "ms-secret", "MODELSCOPE_DOMAIN": "mirror.example:8443"}
    assert weights.weights_hub_env("huggingface") == {}
    assert weights.weights_listing_url("a/b", "huggingface", "r1", "http://127.0.0.1:8080/") == \
        "http://127.0.0.1:8080/api/models/a/b/tree/r1?recursive=1"
    with pytest.raises(AnsibleFilterError, match="unknown weights source"):
        weights.weights_hub_env("s3")


def test_stray_files_are_named_per_host_with_why():
    from ansible_collections.npuops.ascend.plugins.filter.weights import weights_stray
    hv = {"n1": {"npuops_weights_manifest": {"unindexed": ["z.safetensors"]}},
          "n2": {"npuops_weights_need": {"stray": ["notes.txt"]}}, "n3": {"npuops_weights_need": {"stray": []}}}
    assert weights_stray(hv, ["n1", "n2", "n3"], "n1") == [
        "n1: z.safetensors (not in the checkpoint's model.safetensors.index.json: left out of the manifest)",
        "n2: notes.txt (not in the seed's manifest)"]


def test_each_weight_set_goes_to_the_nodes_of_its_instances_only():
    plan = {"instances": {"a": {"model": {"model_dir": "/m/k3", "tokenizer_dir": ""}},
                          "b": {"model": {"model_dir": "/m/k3-v2", "tokenizer_dir": "/m/tok"}},
                          "c": {"model": {"model_dir": "/m/k3", "tokenizer_dir": ""}}},
            "hosts": {"n1": {"instance": "a"}, "n2": {"instance": "a"}, "n3": {"instance": "b"},
                      "n4": {"instance": "b"}, "n5": {"instance": "c"}}}
    sets = weights.weights_sets(plan, ["n1", "n2", "n3", "n4", "n5"], [], "n1", "/unused")
    assert [(s["model_dir"], s["instances"], s["nodes"], s["seed"]) for s in sets] == [
        ("/m/k3", ["a", "c"], ["n1", "n2", "n5"], "n1"), ("/m/k3-v2", ["b"], ["n3", "n4"], "n3")]
    assert sets[1]["directories"] == [{"part": "model", "dir": "/m/k3-v2"}, {"part": "tokenizer", "dir": "/m/tok"}]
    # a seed the inventory names seeds its own set; a host out of the play is in no chain
    sets = weights.weights_sets(plan, ["n1", "n2", "n4", "n5"], [], "n4", "/unused")
    assert [(s["nodes"], s["seed"]) for s in sets] == [(["n1", "n2", "n5"], "n1"), (["n4"], "n4")]
    # without a plan (the role on its own): one set over the given nodes
    assert weights.weights_sets(None, ["x", "y"], ["x", "y"], "y", "/m/k3")[0]["seed"] == "y"


def test_a_draft_is_a_weight_set_of_its_own_from_its_repository():
    """The draft (npuops_draft) is copied and verified like the model, to the nodes of the instances that run it, after
    their model sets; the seed downloads it from its preset's repository at npuops_draft_revision."""
    draft = {"name": "inferact_kimi_k3_dspark", "repo": "Inferact/Kimi-K3-DSpark", "dir": "/m/dspark"}
    plan = {"instances": {"a": {"model": {"model_dir": "/m/k3", "tokenizer_dir": ""}, "draft": draft},
                          "b": {"model": {"model_dir": "/m/k3", "tokenizer_dir": ""}, "draft": None}},
            "hosts": {"n1": {"instance": "a"}, "n2": {"instance": "a"}, "n3": {"instance": "b"},
                      "n4": {"instance": "b"}}}
    sets = weights.weights_sets(plan, ["n1", "n2", "n3", "n4"], [], "n3", "/unused", "", "a1b2c3")
    assert [(s["kind"], s["model_dir"], s["instances"], s["nodes"], s["seed"]) for s in sets] == [
        ("model", "/m/k3", ["a", "b"], ["n1", "n2", "n3", "n4"], "n3"),
        ("draft", "/m/dspark", ["a"], ["n1", "n2"], "n1")]
    assert sets[1]["directories"] == [{"part": "draft", "dir": "/m/dspark", "repo": "Inferact/Kimi-K3-DSpark",
                                       "revision": "a1b2c3"}]
