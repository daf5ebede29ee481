# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.plugin_utils.model import inventory as inv
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import inventory


def good(n=4, tier="4node_dp"):
    groups, hv = inventory(n)
    for h in hv:
        hv[h].update(npuops_tier=tier, npuops_model="kimi_k3_w4a8", npuops_model_dir="/data/models/k3",
                     npuops_image="quay.io/ascend/vllm-ascend:v0.23.0-a3", npuops_container_engine="docker")
    return groups, hv


def good_pd(n=16):
    groups, hv = good(n, "8p8d_pd")
    groups["prefill"], groups["decode"] = groups["npu_nodes"][:8], groups["npu_nodes"][8:16]
    for h in hv:
        hv[h]["npuops_proxy_host"] = "node01"
    return groups, hv


def two_instances(n_per=4, tier="4node_dp"):
    groups, hv = good(2 * n_per, tier)
    for i, h in enumerate(groups["npu_nodes"]):
        hv[h]["npuops_instance"] = "a" if i < n_per else "b"
    return groups, hv


def check(groups, hv, presets):
    return inv.validate_inventory(groups, hv, presets)


def test_a_good_inventory_has_no_problems(presets):
    assert check(*good(), presets=presets) == []
    assert check(*good_pd(), presets=presets) == []
    assert check(*two_instances(), presets=presets) == []


def test_every_problem_is_reported_at_once_with_host_value_and_fix(presets):
    groups, hv = good()
    hv["node02"]["npuops_node_ip"] = "10.0.0.11"
    hv["node03"]["npuops_nic"] = None
    hv["node04"]["npuops_preflight_strict"] = "flase"
    hv["node01"]["npuops_fabric_ip"] = "fast"
    problems = check(groups, hv, presets)
    assert len(problems) == 4, problems
    assert "host node04: npuops_preflight_strict = 'flase' is not a boolean" in problems[0]
    assert "host node01: npuops_fabric_ip = 'fast' is not an IPv4 address" in problems[1]
    assert "host node02: npuops_node_ip 10.0.0.11 is also the address of node01" in problems[2]
    assert "host node03: npuops_nic = None must name the interface" in problems[3]
    assert "-e '{\"npuops_preflight_strict\": false}'" in problems[0]


def test_the_strings_that_mean_true_or_false_are_accepted_others_are_not(presets):
    groups, hv = good()
    hv["node01"].update(npuops_serve_privileged="false", npuops_preflight_strict="True", npuops_serve_ready_timeout="60")
    assert check(groups, hv, presets) == []
    hv["node02"].update(npuops_serve_privileged="nope", npuops_serve_ready_timeout="1h")
    problems = check(groups, hv, presets)
    assert problems == ["host node02: npuops_serve_privileged = 'nope' is not a boolean; write true or false (in "
                        "YAML, or JSON on the command line: -e '{\"npuops_serve_privileged\": false}')",
                        "host node02: npuops_serve_ready_timeout = '1h' is not an integer"]


def test_wrong_tier_model_count_and_paths(presets):
    groups, hv = good(3)
    for h in hv:
        hv[h].update(npuops_model="kimi", npuops_model_dir="models", npuops_image="")
    problems = check(groups, hv, presets)
    assert any("needs 4 hosts per instance in npu_nodes, the inventory has 3" in p for p in problems), problems
    assert any("npuops_model = 'kimi' is not a model preset" in p for p in problems)
    assert any("npuops_model_dir = 'models' must be an absolute path" in p for p in problems)
    assert any("npuops_image = '' must be an image reference" in p for p in problems)
    groups, hv = good()
    for h in hv:
        hv[h]["npuops_tier"] = "3node"
    assert "npuops_tier = '3node' is not a tier; set it to one of 2node_pp, 4node_dp, 4p4d_pd, 8node_a2_dp, 8node_dp, 8p8d_pd" in \
        check(groups, hv, presets)[0]


def test_a_setting_that_differs_between_nodes(presets):
    groups, hv = good()
    hv["node04"]["npuops_image"] = "quay.io/ascend/vllm-ascend:v0.22.0-a3"
    assert any("npuops_image differs between hosts" in p for p in check(groups, hv, presets))
    groups, hv = good()
    hv["node04"]["npuops_model_dir"] = "/other"
    assert any("npuops_model_dir differs between hosts" in p for p in check(groups, hv, presets))


def test_8p8d_groups_and_proxy(presets):
    groups, hv = good_pd()
    groups["decode"] = groups["npu_nodes"][7:14]
    for h in hv:
        hv[h].pop("npuops_proxy_host")
    problems = check(groups, hv, presets)
    assert any("needs 8 hosts in group decode, the inventory has 7" in p for p in problems), problems
    assert any("host node08 is in groups prefill and decode" in p for p in problems)
    assert any("npuops_proxy_host = None is not a host of the inventory" in p for p in problems)


def test_ports_kv_ranges_and_the_proxy_beside_an_engine(presets):
    groups, hv = good_pd()
    for h in hv:
        hv[h]["npuops_prefill_kv_port"] = 30000
    assert check(groups, hv, presets) == ["npuops_prefill_kv_port = 30000 is inside AscendDirect's random port range "
                                          "on A3 nodes; use 36000 or higher (intermittent 'Address already in use' "
                                          "otherwise)"]
    groups, hv = good_pd()
    for h in hv:
        hv[h]["npuops_proxy_port"] = 8000  # node01 serves its prefill rank's API on 8000
    assert check(groups, hv, presets) == ["npuops_proxy_port 8000 (instance main) collides with the engine's own ports "
                                          "on node01; pick another"]
    groups, hv = good_pd()
    hv["node01"]["npuops_api_port"] = "http"
    assert check(groups, hv, presets) == ["host node01: npuops_api_port = 'http' is not an integer"]


def test_model_overrides_are_checked_against_the_preset(presets):
    groups, hv = good()
    for h in hv:
        hv[h]["npuops_model_overrides"] = {"max_num_seq": 8, "max_model_len": "sixty"}
    problems = check(groups, hv, presets)
    assert len(problems) == 2
    assert problems[0] == "npuops_model_overrides: max_model_len = 'sixty': 'sixty' is not an integer (the preset has 133120)"
    assert problems[1].startswith("npuops_model_overrides: 'max_num_seq' is not a preset field; the fields are ")
    assert "max_num_seqs" in problems[1]
    spec = inv.model_spec(presets, "kimi_k3_w4a8", {"max_num_seqs": "8", "enable_prefix_caching": "false"})
    assert spec["max_num_seqs"] == 8 and spec["enable_prefix_caching"] is False
    with pytest.raises(AnsibleFilterError, match="max_num_seq"):
        inv.model_spec(presets, "kimi_k3_w4a8", {"max_num_seq": 8})


def test_vllm_overrides_with_unknown_options_are_named(presets):
    groups, hv = good()
    hv["node03"]["npuops_vllm_overrides"] = {"max_num_seq": 8}
    assert check(groups, hv, presets) == ["host node03: npuops_vllm_overrides: unknown vllm serve option "
                                          "'max_num_seq' (did you mean max_num_seqs?)"]


def test_instances_must_be_complete_disjoint_and_named_everywhere(presets):
    groups, hv = two_instances()
    hv["node08"]["npuops_instance"] = "a"
    problems = check(groups, hv, presets)
    assert any("instance a has 5" in p for p in problems) and any("instance b has 3" in p for p in problems), problems
    groups, hv = two_instances()
    hv["node05"].pop("npuops_instance")
    assert check(groups, hv, presets)[0].startswith("npuops_instance is set on node01, node02, node03, node04, "
                                                    "node06, node07, node08 but not on node05")
    groups, hv = two_instances()
    hv["node06"]["npuops_node_ip"] = "10.0.0.12"
    assert check(groups, hv, presets) == ["host node06: npuops_node_ip 10.0.0.12 is also the address of node02; "
                                          "every node needs its own"]
    groups, hv = two_instances()
    for h in ("node05", "node06", "node07", "node08"):
        hv[h]["npuops_image"] = "quay.io/ascend/vllm-ascend:v0.24.0-a3"  # a canary: another image per instance
    assert check(groups, hv, presets) == []
    hv["node08"]["npuops_image"] = "quay.io/ascend/vllm-ascend:v0.25.0-a3"
    assert check(groups, hv, presets)[0].startswith("npuops_image differs between hosts of instance b")


def test_pd_instances_need_their_own_proxy_hosts(presets):
    groups, hv = good(32, "8p8d_pd")
    nodes = groups["npu_nodes"]
    groups["prefill"], groups["decode"] = nodes[:8] + nodes[16:24], nodes[8:16] + nodes[24:]
    for i, h in enumerate(nodes):
        hv[h].update(npuops_instance="a" if i < 16 else "b", npuops_proxy_host="node01")
    assert check(groups, hv, presets) == ["instances a, b all name npuops_proxy_host node01; each instance needs its "
                                          "own proxy host"]


def test_no_npu_nodes_group(presets):
    assert "no hosts in group npu_nodes" in inv.validate_inventory({}, {}, presets)[0]


def test_a_misspelt_variable_is_named_with_the_closest_known_one(presets):
    groups, hv = good()
    for h in hv:
        hv[h]["npuops_servce_api_key"] = "sk-1234567890"  # a group variable, misspelt
    hv["node03"]["npuops_frobnicate_the_zorp"] = 1
    assert check(groups, hv, presets) == [
        "host node03: npuops_frobnicate_the_zorp is not an npuops variable (nothing reads it); correct or remove it "
        "(docs/inventory.md lists the variables)",
        "hosts node01, node02, node03, node04: npuops_servce_api_key is not an npuops variable (nothing reads it); "
        "did you mean npuops_serve_api_key?"]


def test_every_option_of_every_role_and_every_tier_port_is_known(presets):
    """What the roles declare (argument specs), define or set, and the tiers' port variables are all accepted."""
    from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog
    groups, hv = good()
    names = set(catalog.role_options()) | {"npuops_prefill_kv_port", "npuops_hccl_host_base_port", "npuops_plan"}
    assert "npuops_serve_api_key" in names and "npuops_weights_hub_token" in names
    assert [p for p in inv.variable_problems(["node01"], {"node01": dict((n, None) for n in names)},
                                             inv.catalog.tiers()) if "not an npuops variable" in p] == []


def test_every_variable_of_the_table_is_known_and_typed_by_its_row(presets):
    """The table of inventory variables (data/inventory_variables.yml) is what the validator accepts: a variable read
    only where it is used (npuops_fabric_mem, npuops_disk_write_mb_s) is no misspelling; a plan-stage row's type is
    checked (the plan role's argument spec is made from the table)."""
    from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog
    rows = catalog.inventory_variables()
    assert {"npuops_fabric_mem", "npuops_disk_write_mb_s", "npuops_fabric_link_gbit"} <= set(rows)
    hv = {"node01": dict((n, None) for n in rows)}
    assert [p for p in inv.variable_problems(["node01"], hv, inv.catalog.tiers())
            if "not an npuops variable" in p] == []
    hv = {"node01": {"npuops_fabric_mem": "flase", "npuops_disk_write_mb_s": "fast"}}
    assert inv.variable_problems(["node01"], hv, inv.catalog.tiers()) == [
        "host node01: npuops_disk_write_mb_s = 'fast' is not a number",
        "host node01: npuops_fabric_mem = 'flase' is not a boolean; write true or false (in YAML, or JSON on the "
        "command line: -e '{\"npuops_fabric_mem\": false}')"]


def test_an_empty_api_key_is_refused(presets):
    groups, hv = good()
    for h in hv:
        hv[h]["npuops_serve_api_key"] = ""
    assert check(groups, hv, presets) == [
        "hosts node01, node02, node03, node04: npuops_serve_api_key is empty: set the key the service is to require "
        "(from a vault), or leave the variable out for a service without one"]


def test_two_hosts_with_one_ansible_host_are_named_both(presets):
    groups, hv = good()
    for i, h in enumerate(sorted(hv)):
        hv[h]["ansible_host"] = "192.168.1.%d" % (11 + i)
    hv["node03"]["ansible_host"] = "192.168.1.12"
    problems = check(groups, hv, presets)
    assert problems == ["hosts node02 and node03 have the same ansible_host 192.168.1.12: Ansible would reach one "
                        "machine for all of them; give each its own address"]


def test_a_host_in_two_instance_groups_is_named_even_when_the_counts_balance(presets):
    groups, hv = two_instances()
    groups["instance_a"] = groups["npu_nodes"][:4]
    groups["instance_b"] = groups["npu_nodes"][4:]
    # node04 listed under instance_b too (Ansible gives it b), node05 left out of instance_b: the counts still balance
    groups["instance_b"] = ["node04"] + groups["npu_nodes"][5:]
    groups["instance_a"].append("node05")
    hv["node04"]["npuops_instance"], hv["node05"]["npuops_instance"] = "b", "a"
    problems = [p for p in check(groups, hv, presets) if "instance" in p]
    assert problems == [
        "host node04 is in group instance_a (instance a) and in instance_b, so Ansible gave it npuops_instance b; a "
        "host belongs to one instance: remove it from one group"], problems


def test_xpyd_node_counts_are_checked_whole_positive_and_the_same_everywhere(presets):
    """npuops_prefill_nodes / npuops_decode_nodes size the PD tier (xPyD); the groups must hold that many hosts."""
    groups, hv = good_pd(6)
    groups["prefill"], groups["decode"] = groups["npu_nodes"][:4], groups["npu_nodes"][4:]
    for h in hv:
        hv[h].update(npuops_prefill_nodes=4, npuops_decode_nodes=2)
    assert check(groups, hv, presets) == []
    hv["node03"]["npuops_decode_nodes"] = 3
    assert check(groups, hv, presets) == [
        "npuops_decode_nodes differs between hosts (2 on node01, node02, node04, node05, node06; 3 on node03); it must "
        "be the same on every node of the cluster"]
    for h in hv:
        hv[h]["npuops_decode_nodes"] = 0
    assert check(groups, hv, presets) == ["host node01: npuops_decode_nodes = 0 is outside [1, 64]"]
    for h in hv:
        hv[h]["npuops_decode_nodes"] = 3
    problems = check(groups, hv, presets)
    # the count comes from npuops_prefill_nodes and npuops_decode_nodes: the refusal names them, they are the fix
    assert "npuops_tier 8p8d_pd needs 7 hosts per instance in npu_nodes, the inventory has 6 (node01, node02, node03, " \
        "node04, node05, node06): npuops_prefill_nodes 4 + npuops_decode_nodes 3; set them to the hosts of each " \
        "side's group" in problems, problems


def test_a_memcache_kv_pool_needs_a_tier_that_has_one(presets):
    groups, hv = good()
    for h in hv:
        hv[h]["npuops_kv_pool"] = "memcache"
    assert check(groups, hv, presets) == ["npuops_kv_pool = memcache: tier 4node_dp has no memcache KV pool (only a "
                                          "prefill/decode tier whose recipe publishes one does); set it to none"]
    groups, hv = good_pd()
    for h in hv:
        hv[h].update(npuops_kv_pool="memcache", npuops_kv_pool_host="node99")
    assert check(groups, hv, presets) == ["npuops_kv_pool_host = 'node99' is not a host of the inventory; name the "
                                          "host that runs the MetaService (default: the proxy host)"]


def test_replicas_may_serve_different_weights_but_each_instance_one(presets):
    groups, hv = two_instances()
    for h in groups["npu_nodes"][:4]:  # instance a: the tutorial's image, so its recipe (chosen by the image's line)
        hv[h]["npuops_image"] = "quay.io/ascend/vllm-ascend:nightly-main-a3"
    for h in groups["npu_nodes"][4:]:
        hv[h].update(npuops_model_dir="/data/models/k3-v2", npuops_model_overrides={"served_model_name": "k3-v2"},
                     npuops_recipe="vllm_ascend_kimi_k3_4node_a3")
    assert check(groups, hv, presets) == []
    specs = inv.instance_specs(groups, hv, presets)
    assert [specs[n]["model_dir"] for n in "ab"] == ["/data/models/k3", "/data/models/k3-v2"]
    assert [specs[n]["served_model_name"] for n in "ab"] == ["kimi-k3", "k3-v2"]
    assert [specs[n]["recipe"]["name"] for n in "ab"] == ["kimi_k3_tutorial_4node_a3", "vllm_ascend_kimi_k3_4node_a3"]
    # each instance is planned with its own recipe's ports (the tutorial's RPC_PORT=13345, the page's none)
    assert [specs[n]["tier"]["ports"]["dp_rpc"] for n in "ab"] == [13345, 13389]
    hv["node08"]["npuops_model_dir"] = "/data/models/k3"
    hv["node05"]["npuops_model"] = "kimi"
    for h in groups["npu_nodes"][4:]:
        hv[h]["npuops_model"] = "kimi"
    problems = check(groups, hv, presets)
    assert any(p.startswith("npuops_model = 'kimi' (instance b) is not a model preset") for p in problems), problems
    assert any(p.startswith("npuops_model_dir differs between hosts of instance b (") for p in problems), problems
    assert not any("instance a" in p for p in problems), problems
    assert not any("instance a" in p for p in problems), problems


def test_a_list_option_with_choices_is_checked_item_by_item(presets):
    """npuops_validate_checks: [health, chat] picks two of the validate role's checks, as its argument spec allows;
    the validator compared the whole list with the choices and refused every list, the default included."""
    hv = {"node01": {"npuops_validate_checks": ["health", "chat"], "npuops_accuracy_checks": ["golden", "api"]}}
    assert inv.variable_problems(["node01"], hv, inv.catalog.tiers()) == []
    hv = {"node01": {"npuops_validate_checks": ["health", "helth"]}}
    assert inv.variable_problems(["node01"], hv, inv.catalog.tiers()) == [
        "host node01: npuops_validate_checks: 'helth' must be one of health, models, chat, reasoning, tool_call, "
        "image, long_prompt, stream"]


def test_the_inventory_is_read_once_each_recipe_chosen_once(presets, monkeypatch):
    """inventory_model checks the inventory and reads it into what the stages use in one pass: the recipe the check
    chose for an instance is the one it serves (recipes.choose once per instance, not again), the service's tier is
    the first instance's, and the plan names both instances."""
    calls = []
    choose = inv.recipes.choose
    monkeypatch.setattr(inv.recipes, "choose", lambda *a: calls.append(a) or choose(*a))
    groups, hv = two_instances()
    model = inv.inventory_model(groups, hv, presets)
    assert model["problems"] == [] and sorted(model["instances"]) == ["a", "b"]
    assert len(calls) == 2  # one per instance
    assert model["instances"]["a"]["recipe"]["name"] == model["instances"]["b"]["recipe"]["name"] == \
        "vllm_ascend_kimi_k3_4node_a3"
    assert model["tier"] is model["instances"]["a"]["tier"] and model["tier"]["name"] == "4node_dp"
    assert sorted(model["plan"]["instances"]) == ["a", "b"] and model["plan"]["hosts"]["node05"]["instance"] == "b"


def test_a_wrong_inventory_reads_into_its_problems_alone(presets):
    groups, hv = two_instances()
    hv["node01"]["npuops_node_ip"] = "not-an-address"
    model = inv.inventory_model(groups, hv, presets)
    assert model["instances"] is None and model["tier"] is None and model["plan"] is None
    assert any(p.startswith("host node01: npuops_node_ip = 'not-an-address' is not an IPv4 address")
               for p in model["problems"]), model["problems"]
