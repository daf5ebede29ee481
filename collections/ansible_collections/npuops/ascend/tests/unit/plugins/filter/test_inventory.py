# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.filter import inventory as inv
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import inventory

TIERS = {"2node_pp": 2, "4node_dp": 4, "8p8d_pd": 16}
GROUPS = {"8p8d_pd": {"prefill": 8, "decode": 8}}


def good(n=4, tier="4node_dp"):
    groups, hv = inventory(n)
    for h in hv:
        hv[h].update(npuops_tier=tier, npuops_model="kimi_k3_w4a8", npuops_model_dir="/data/models/k3",
                     npuops_image="quay.io/ascend/vllm-ascend:v0.23.0-a3", npuops_container_engine="docker")
    return groups, hv


def check(groups, hv, presets):
    return inv.validate_inventory(groups, hv, TIERS, presets, ["npuops_preflight_strict"], GROUPS)


def test_a_good_inventory_has_no_problems(presets):
    assert check(*good(), presets=presets) == []


def test_every_problem_is_reported_at_once_with_host_value_and_fix(presets):
    groups, hv = good()
    hv["node02"]["npuops_node_ip"] = "10.0.0.11"
    hv["node03"]["npuops_nic"] = None
    hv["node04"]["npuops_preflight_strict"] = "false"
    hv["node01"]["npuops_fabric_ip"] = "fast"
    problems = check(groups, hv, presets)
    assert len(problems) == 4
    assert "host node02: npuops_node_ip 10.0.0.11 is also the address of node01" in problems[1]
    assert "host node03: npuops_nic = None must name the interface" in problems[2]
    assert "host node04: npuops_preflight_strict = 'false' is a string, not a boolean" in problems[3]
    assert "-e '{\"npuops_preflight_strict\": false}'" in problems[3]
    assert "host node01: npuops_fabric_ip = 'fast' is not an IPv4 address" in problems[0]


def test_wrong_tier_model_count_and_paths(presets):
    groups, hv = good(3)
    for h in hv:
        hv[h].update(npuops_model="kimi", npuops_model_dir="models", npuops_image="")
    problems = check(groups, hv, presets)
    assert any("needs 4 hosts in npu_nodes, the inventory has 3" in p for p in problems)
    assert any("npuops_model = 'kimi' is not a model preset" in p for p in problems)
    assert any("npuops_model_dir = 'models' must be an absolute path" in p for p in problems)
    assert any("npuops_image = '' must be an image reference" in p for p in problems)
    groups, hv = good()
    for h in hv:
        hv[h]["npuops_tier"] = "3node"
    assert "npuops_tier = '3node' is not a tier" in check(groups, hv, presets)[0]


def test_a_setting_that_differs_between_nodes(presets):
    groups, hv = good()
    hv["node04"]["npuops_image"] = "quay.io/ascend/vllm-ascend:v0.22.0-a3"
    assert any("npuops_image differs between hosts" in p for p in check(groups, hv, presets))


def test_8p8d_groups_and_proxy(presets):
    groups, hv = good(16, "8p8d_pd")
    groups["prefill"], groups["decode"] = groups["npu_nodes"][:8], groups["npu_nodes"][7:14]
    problems = check(groups, hv, presets)
    assert any("needs 8 hosts in group decode, the inventory has 7" in p for p in problems)
    assert any("hosts node08 are in more than one of the groups" in p for p in problems)
    assert any("npuops_proxy_host = None is not a host" in p for p in problems)


def test_no_npu_nodes_group(presets):
    assert "no hosts in group npu_nodes" in inv.validate_inventory({}, {}, TIERS, presets)[0]
