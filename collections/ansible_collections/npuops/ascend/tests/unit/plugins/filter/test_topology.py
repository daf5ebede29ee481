# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import re

import pytest

from ansible_collections.npuops.ascend.plugins.plugin_utils.model import topology
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import inventory, tier_spec


def pd_inventory(n=16, proxy="node01"):
    groups, hv = inventory(n)
    groups["prefill"], groups["decode"] = groups["npu_nodes"][:8], groups["npu_nodes"][8:16]
    for h in hv:
        hv[h]["npuops_proxy_host"] = proxy
    return groups, hv


def replicas(n_per, count, tier):
    """`count` instances a, b, ... of `n_per` hosts each."""
    groups, hv = inventory(n_per * count)
    for i, h in enumerate(groups["npu_nodes"]):
        hv[h]["npuops_instance"] = "ab"[i // n_per]
    return groups, hv, tier_spec(tier)


def test_2node_pp_plans_a_leader_and_a_headless_worker_sharing_the_master_port():
    groups, hv = inventory(2)
    plan = topology.plan_topology(groups, hv, tier_spec("2node_pp"))
    lead, work = plan["hosts"]["node01"], plan["hosts"]["node02"]
    assert (lead["role"], lead["node_rank"], lead["headless"], lead["serves_http"]) == ("leader", 0, False, True)
    assert (work["role"], work["node_rank"], work["headless"], work["api_port"]) == ("worker", 1, True, None)
    assert work["leader_address"] == "10.0.0.11" and (lead["tp"], lead["pp"], lead["dp"]) == (16, 2, 1)
    assert (lead["instance"], lead["group"], lead["group_key"]) == ("main", "main", "main/main")
    assert lead["listen"] == [29500] and lead["listen_expect"] == 1
    assert work["reach"] == [{"host": "node01", "address": "10.0.0.11", "port": 29500}]
    assert plan["endpoint"] == "http://10.0.0.11:8000" and plan["health_path"] == "/health"
    assert {8000, 29500, 60000, 60015} <= set(lead["ports_free"]) and 8000 not in work["ports_free"]
    assert list(plan["instances"]) == ["main"] and plan["instances"]["main"]["hosts"] == ["node01", "node02"]


def test_4node_dp_gives_every_worker_a_unique_start_rank():
    groups, hv = inventory(4)
    plan = topology.plan_topology(groups, hv, tier_spec("4node_dp"))
    ranks = [plan["hosts"][h]["dp_start_rank"] for h in groups["npu_nodes"]]
    assert ranks == [0, 1, 2, 3]
    assert [plan["hosts"][h]["headless"] for h in groups["npu_nodes"]] == [False, True, True, True]
    assert plan["hosts"]["node01"]["listen"] == [13389] and plan["hosts"]["node01"]["listen_expect"] == 3
    assert all(plan["hosts"][h]["expert_parallel"] for h in groups["npu_nodes"])


def test_8p8d_plans_two_dp_groups_and_the_proxy_lists():
    groups, hv = pd_inventory()
    plan = topology.plan_topology(groups, hv, tier_spec("8p8d_pd"))
    p, d = plan["hosts"]["node03"], plan["hosts"]["node11"]
    assert (p["group"], p["kv_role"], p["dp_start_rank"], p["leader"]) == ("prefill", "kv_producer", 2, "node01")
    assert (d["group"], d["kv_role"], d["dp_start_rank"], d["leader"]) == ("decode", "kv_consumer", 2, "node09")
    assert p["serves_http"] and d["serves_http"]  # external DP: every rank has an API server
    assert p["kv_ports"] == [36032, 36047] and d["kv_ports"] == [36232, 36247]
    proxy = plan["instances"]["main"]["proxy"]
    assert len(proxy["prefill"]) == 8 and len(proxy["decode"]) == 8
    assert proxy["decode"][0] == {"host": "node09", "address": "10.0.0.19", "port": 8000}
    assert plan["endpoint"] == "http://10.0.0.11:8080" and plan["health_path"] == "/healthcheck"
    assert 8080 in plan["hosts"]["node01"]["ports_free"] and 8080 not in plan["hosts"]["node01"]["engine_ports"]
    assert len(plan["api_urls"]) == 16


def test_ports_come_from_the_inventory_typed():
    groups, hv = pd_inventory()
    for h in hv:
        hv[h].update(npuops_api_port="9000", npuops_decode_kv_port=37000, npuops_proxy_port="9090")
    plan = topology.plan_topology(groups, hv, tier_spec("8p8d_pd"))
    assert plan["hosts"]["node09"]["api_port"] == 9000 and plan["hosts"]["node09"]["kv_ports"] == [37000, 37015]
    assert plan["endpoint"] == "http://10.0.0.11:9090"
    assert plan["instances"]["main"]["ports"] == {"api": 9000, "dp_rpc": 13389, "hccl_host_base": 60000}


def test_two_instances_of_a_tier_are_planned_each_on_its_own():
    groups, hv, tier = replicas(4, 2, "4node_dp")
    plan = topology.plan_topology(groups, hv, tier)
    assert list(plan["instances"]) == ["a", "b"]
    a, b = plan["instances"]["a"], plan["instances"]["b"]
    assert a["hosts"] == ["node01", "node02", "node03", "node04"] and b["leader"] == "node05"
    assert [plan["hosts"][h]["dp_start_rank"] for h in b["hosts"]] == [0, 1, 2, 3]
    assert plan["hosts"]["node07"]["leader_address"] == "10.0.0.15" and plan["hosts"]["node07"]["group_key"] == "b/main"
    assert (a["endpoint"], b["endpoint"]) == ("http://10.0.0.11:8000", "http://10.0.0.15:8000")
    assert plan["api_urls"] == [a["endpoint"], b["endpoint"]]


def test_two_pd_instances_take_their_sides_from_the_shared_groups():
    groups, hv = inventory(32)
    nodes = groups["npu_nodes"]
    groups["prefill"] = nodes[:8] + nodes[16:24]
    groups["decode"] = nodes[8:16] + nodes[24:]
    for i, h in enumerate(nodes):
        hv[h].update(npuops_instance="a" if i < 16 else "b", npuops_proxy_host="node01" if i < 16 else "node17")
    plan = topology.plan_topology(groups, hv, tier_spec("8p8d_pd"))
    b = plan["instances"]["b"]
    assert b["groups"]["prefill"]["hosts"] == nodes[16:24] and b["groups"]["decode"]["leader"] == "node25"
    assert b["proxy"]["host"] == "node17" and b["proxy"]["decode"][0]["host"] == "node25"
    assert plan["hosts"]["node26"]["group_key"] == "b/decode" and plan["hosts"]["node26"]["dp_start_rank"] == 1


@pytest.mark.parametrize("change,message", [
    (lambda t: t["groups"][0].update(tp=8), r"TP x PP x DP = 8 x 2 x 1 = 16, but 2 nodes x 16 dies = 32"),
    (lambda t: t["groups"][0].update(pp=1, dp=2, tp=16), r"multinode launch .* keeps DP=1"),
    (lambda t: t["groups"][0].update(tp=8, pp=2, dp=2, launch="dp_internal", dp_local=1), r"PP=2 together with DP=2"),
    (lambda t: t["groups"][0].update(launch="ray"), r"launch 'ray'"),
    (lambda t: t.update(nodes=3), r"the groups' nodes add up to 2, the tier has 3"),
])
def test_bad_arithmetic_is_refused_with_the_numbers(change, message):
    tier = copy.deepcopy(tier_spec("2node_pp"))
    assert topology.tier_problems(tier) == []
    change(tier)
    problems = topology.tier_problems(tier)
    assert len(problems) == 1 and problems[0].startswith("tier 2node_pp: ")
    assert re.search(message, problems[0]), problems


@pytest.mark.parametrize("change,message", [
    (lambda t: t["groups"][0].update(tp=8, dp=16, dp_local=2), r"prefill TP 8 must be a multiple of decode TP 16"),
    (lambda t: (t["groups"][0].update(kv_connector_extra_config={"a": 1}),
                t["groups"][1].update(kv_connector_extra_config={"a": 2})), r"differs between prefill"),
    (lambda t: t["groups"][1].update(kv_role="kv_producer"), r"exactly one kv_producer"),
    (lambda t: t.update(proxy=None), r"needs a proxy"),
])
def test_bad_pd_settings_are_refused(change, message):
    tier = copy.deepcopy(tier_spec("8p8d_pd"))
    assert topology.tier_problems(tier) == []
    change(tier)
    assert any(re.search(message, p) for p in topology.tier_problems(tier)), topology.tier_problems(tier)


def test_every_tier_document_of_the_collection_is_sound():
    from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog
    tiers = catalog.tiers()
    assert sorted(tiers) == ["2node_pp", "4node_dp", "4p4d_pd", "8node_a2_dp", "8node_dp", "8p8d_pd"]
    for tier in tiers.values():
        assert topology.tier_problems(tier) == [], tier["name"]
