# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.filter import topology
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import inventory, tier_spec


def test_2node_pp_plans_a_leader_and_a_headless_worker_sharing_the_master_port():
    groups, hv = inventory(2)
    plan = topology.plan_topology(groups, hv, tier_spec("2node_pp"))
    lead, work = plan["hosts"]["node01"], plan["hosts"]["node02"]
    assert (lead["role"], lead["node_rank"], lead["headless"], lead["serves_http"]) == ("leader", 0, False, True)
    assert (work["role"], work["node_rank"], work["headless"], work["api_port"]) == ("worker", 1, True, None)
    assert work["leader_address"] == "10.0.0.11" and (lead["tp"], lead["pp"], lead["dp"]) == (16, 2, 1)
    assert lead["listen"] == [29500] and lead["listen_expect"] == 1
    assert work["reach"] == [{"host": "node01", "address": "10.0.0.11", "port": 29500}]
    assert plan["endpoint"] == "http://10.0.0.11:8000"
    assert {8000, 29500, 60000, 60015} <= set(lead["ports_free"]) and 8000 not in work["ports_free"]


def test_4node_dp_gives_every_worker_a_unique_start_rank():
    groups, hv = inventory(4)
    plan = topology.plan_topology(groups, hv, tier_spec("4node_dp"))
    ranks = [plan["hosts"][h]["dp_start_rank"] for h in groups["npu_nodes"]]
    assert ranks == [0, 1, 2, 3]
    assert [plan["hosts"][h]["headless"] for h in groups["npu_nodes"]] == [False, True, True, True]
    assert plan["hosts"]["node01"]["listen"] == [13389] and plan["hosts"]["node01"]["listen_expect"] == 3
    assert all(plan["hosts"][h]["expert_parallel"] for h in groups["npu_nodes"])


def test_8p8d_plans_two_dp_groups_and_the_proxy_lists():
    groups, hv = inventory(16)
    groups["prefill"], groups["decode"] = groups["npu_nodes"][:8], groups["npu_nodes"][8:]
    plan = topology.plan_topology(groups, hv, tier_spec("8p8d_pd", npuops_proxy_host="node01"))
    p, d = plan["hosts"]["node03"], plan["hosts"]["node11"]
    assert (p["instance"], p["kv_role"], p["dp_start_rank"], p["leader"]) == ("prefill", "kv_producer", 2, "node01")
    assert (d["instance"], d["kv_role"], d["dp_start_rank"], d["leader"]) == ("decode", "kv_consumer", 2, "node09")
    assert p["serves_http"] and d["serves_http"]  # external DP: every rank has an API server
    assert p["kv_ports"] == [36032, 36047] and d["kv_ports"] == [36232, 36247]
    assert len(plan["proxy"]["prefill"]) == 8 and len(plan["proxy"]["decode"]) == 8
    assert plan["proxy"]["decode"][0] == {"host": "node09", "address": "10.0.0.19", "port": 8000}
    assert plan["endpoint"] == "http://10.0.0.11:8080"
    assert 8080 in plan["hosts"]["node01"]["ports_free"]


@pytest.mark.parametrize("change,message", [
    (lambda t: t["instances"][0].update(tp=8), r"TP x PP x DP = 8 x 2 x 1 = 16, but 2 nodes x 16 dies = 32"),
    (lambda t: t["instances"][0].update(pp=1, dp=2, tp=16), r"multinode launch .* keeps DP=1"),
    (lambda t: t["instances"][0].update(tp=8, pp=2, dp=2), r"PP=2 together with DP=2"),
    (lambda t: t["instances"][0].update(launch="ray"), r"launch 'ray'"),
])
def test_bad_arithmetic_is_refused_with_the_numbers(change, message):
    groups, hv = inventory(2)
    tier = copy.deepcopy(tier_spec("2node_pp"))
    change(tier)
    with pytest.raises(AnsibleFilterError, match=message):
        topology.plan_topology(groups, hv, tier)


@pytest.mark.parametrize("change,message", [
    (lambda t: t["instances"][0].update(tp=8, dp=16, dp_local=2), r"prefill TP 8 must be a multiple of decode TP 16"),
    (lambda t: t["instances"][0].update(kv_port=30000), r"kv_port 30000 is inside AscendDirect"),
    (lambda t: (t["instances"][0].update(kv_connector_extra_config={"a": 1}),
                t["instances"][1].update(kv_connector_extra_config={"a": 2})), r"differs between prefill"),
    (lambda t: t["instances"][1].update(kv_role="kv_producer"), r"exactly one kv_producer"),
])
def test_bad_pd_settings_are_refused(change, message):
    groups, hv = inventory(16)
    groups["prefill"], groups["decode"] = groups["npu_nodes"][:8], groups["npu_nodes"][8:]
    tier = copy.deepcopy(tier_spec("8p8d_pd", npuops_proxy_host="node01"))
    change(tier)
    with pytest.raises(AnsibleFilterError, match=message):
        topology.plan_topology(groups, hv, tier)


def test_inventory_problems_name_the_host():
    groups, hv = inventory(4)
    hv["node03"]["npuops_node_ip"] = "10.0.0.11"
    with pytest.raises(AnsibleFilterError, match=r"node01 and node03 have the same npuops_node_ip 10.0.0.11"):
        topology.plan_topology(groups, hv, tier_spec("4node_dp"))
    groups, hv = inventory(3)
    with pytest.raises(AnsibleFilterError, match=r"needs 4 hosts in group npu_nodes, the inventory has 3"):
        topology.plan_topology(groups, hv, tier_spec("4node_dp"))
    groups, hv = inventory(16)
    groups["prefill"], groups["decode"] = groups["npu_nodes"][:8], groups["npu_nodes"][8:]
    with pytest.raises(AnsibleFilterError, match=r"npuops_proxy_host"):
        topology.plan_topology(groups, hv, tier_spec("8p8d_pd"))
    groups["decode"] = groups["npu_nodes"][7:15]
    with pytest.raises(AnsibleFilterError, match=r"host node08 is in instance prefill and decode"):
        topology.plan_topology(groups, hv, tier_spec("8p8d_pd", npuops_proxy_host="node01"))
