# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.filter import weights
from ansible_collections.npuops.ascend.plugins.plugin_utils.model import serve, topology
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import inventory, rendered, tier_spec


def containers(tier_name, n, preset="kimi_k3_w4a8", extra_groups=None, **host_values):
    groups, hv = inventory(n)
    groups.update(extra_groups(groups) if extra_groups else {})
    for h in hv:
        hv[h].update(host_values)
    tier, model, opts = rendered(tier_name, preset)
    plan = topology.plan_topology(groups, hv, tier)
    return serve.serve_containers(plan, hv, tier, model, opts), plan, hv, tier


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_2node_pp_leader_and_headless_worker():
    out, _plan, _hv, _t = containers("2node_pp", 2, "kimi_k3_1_pro_w4a8")
    lead, work = out["node01"]["engine"], out["node02"]["engine"]
    for c, rank in ((lead, "0"), (work, "1")):
        argv = c["command"]
        assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == rank
        assert flag(argv, "--master-addr") == "10.0.0.11" and flag(argv, "--pipeline-parallel-size") == "2"
        # the field report's template: int8 KV, block 768, expert parallel
        assert flag(argv, "--kv-cache-dtype") == "int8" and flag(argv, "--block-size") == "768"
        assert "--enable-expert-parallel" in argv and "--data-parallel-size" not in argv
    assert "--headless" in work["command"] and "--port" not in work["command"]
    assert flag(lead["command"], "--host") == "10.0.0.11" and work["ready_url"] == "http://10.0.0.11:8000/health"
    assert work["peers"] == ["10.0.0.11:29500"] and lead["peers"] == []


def test_4node_dp_env_devices_and_mounts():
    out, _plan, _hv, _t = containers("4node_dp", 4)
    c = out["node03"]["engine"]
    assert flag(c["command"], "--data-parallel-start-rank") == "2" and "--headless" in c["command"]
    assert flag(c["command"], "--data-parallel-address") == "10.0.0.11"
    env = c["env"]
    assert env["HCCL_IF_IP"] == env["VLLM_HOST_IP"] == "10.0.0.13"
    assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == env["HCCL_SOCKET_IFNAME"] == "enp189s0f0"
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(16))
    assert env["HCCL_BUFFSIZE"] == "1024" and env["HCCL_BUFFSIZE_EP"] == "2048"
    assert c["devices"][:2] == ["/dev/davinci0", "/dev/davinci1"] and "/dev/hisi_hdc" in c["devices"]
    assert len(c["devices"]) == 19
    assert "/etc/hccn.conf:/etc/hccn.conf:ro" in c["mounts"] and "/data/models/k3:/data/models/k3:ro" in c["mounts"]
    assert c["shm_size"] == "16g"


def test_the_optional_host_paths_are_the_inventorys_one_list_and_follow_the_needed_ones():
    """npuops_serve_optional_mounts is the one statement of the host paths an engine gets only where they exist: by
    default /etc/hccn.conf, after the driver files; a path of the operator's is mounted too, one already needed is
    not mounted twice, and an empty list mounts none (the serve stage drops the ones a node lacks)."""
    driver = ["/usr/local/dcmi", "/usr/local/Ascend/driver/tools/hccn_tool", "/usr/local/bin/npu-smi",
              "/usr/local/Ascend/driver/lib64", "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info"]
    for optional, host_paths in (
            (None, driver + ["/etc/hccn.conf"]),
            (["/etc/hccn.conf", "/etc/npu-topology.conf", "/usr/local/dcmi"],
             driver + ["/etc/hccn.conf", "/etc/npu-topology.conf"]),
            ([], driver)):
        values = {} if optional is None else {"npuops_serve_optional_mounts": optional}
        out, _plan, _hv, _t = containers("4node_dp", 4, **values)
        assert out["node02"]["engine"]["mounts"] == ["%s:%s:ro" % (m, m) for m in host_paths + ["/data/models/k3"]]


@pytest.mark.parametrize("tokenizer_dir, mounted", [
    ("/data/tokenizers/k3", True),      # apart: copied by the weights stage and mounted
    ("/data/models/k3/tokenizer", False),  # inside the model directory: its mount covers it
    ("/data/models/k3/", False),        # the model directory itself
    ("/data/models/k3-tok", True),      # a sibling whose name starts like it is apart
])
def test_the_tokenizer_directory_is_mounted_only_when_it_lies_outside_the_model(tokenizer_dir, mounted):
    tier, model, opts = rendered("4node_dp", "kimi_k3_w4a8")
    groups, hv = inventory(4)
    plan = topology.plan_topology(groups, hv, tier)
    c = serve.serve_containers(plan, hv, tier, model, dict(opts, tokenizer_dir=tokenizer_dir))["node02"]["engine"]
    assert flag(c["command"], "--tokenizer") == tokenizer_dir  # the tutorial's --tokenizer "$TOKENIZER_PATH"
    tokenizer_mounts = [m for m in c["mounts"] if m.startswith("/data/") and m != "/data/models/k3:/data/models/k3:ro"]
    assert tokenizer_mounts == (["%s:%s:ro" % (tokenizer_dir, tokenizer_dir)] if mounted else [])
    assert weights.weights_directories("/data/models/k3", tokenizer_dir) == (
        [{"part": "model", "dir": "/data/models/k3"}] + ([{"part": "tokenizer", "dir": tokenizer_dir}] if mounted else []))


def test_8p8d_kv_transfer_and_proxy():
    out, plan, _hv, _t = containers("8p8d_pd", 16, extra_groups=lambda g: {"prefill": g["npu_nodes"][:8],
                                                                           "decode": g["npu_nodes"][8:]},
                                    npuops_proxy_host="node01")
    p, d = out["node03"]["engine"], out["node12"]["engine"]
    kvp = json.loads(flag(p["command"], "--kv-transfer-config"))
    kvd = json.loads(flag(d["command"], "--kv-transfer-config"))
    # the recipe's producer connector without the memcache pool (deviation no_memcache_pool_yet)
    assert (kvp["kv_connector"], kvp["kv_role"], kvp["kv_port"], kvd["kv_role"], kvd["kv_port"]) == (
        "MooncakeConnectorV1", "kv_producer", "36000", "kv_consumer", "36200")
    assert kvp["kv_connector_extra_config"] == kvd["kv_connector_extra_config"]
    assert kvp["engine_id"] == "prefill-2" and kvd["engine_id"] == "decode-3"
    assert flag(p["command"], "--data-parallel-rank") == "2" and "--headless" not in p["command"]
    assert "--enable-prefix-caching" in d["command"] and "--enable-prefix-caching" in p["command"]
    assert "--enforce-eager" in p["command"] and "--enforce-eager" not in d["command"]
    assert p["env"]["HCCL_BUFFSIZE"] == d["env"]["HCCL_BUFFSIZE"] == "1024"
    assert d["env"]["HCCL_OP_EXPANSION_MODE"] == "AIV" and "HCCL_OP_EXPANSION_MODE" not in p["env"]
    assert "MMC_LOCAL_CONFIG_PATH" not in p["env"] and "LD_LIBRARY_PATH" not in p["env"]
    proxy = out["node01"]["proxy"]["command"]
    hosts = proxy[proxy.index("--prefiller-hosts") + 1:proxy.index("--prefiller-ports")]
    assert hosts == ["10.0.0.%d" % (11 + i) for i in range(8)]
    assert proxy[proxy.index("--decoder-ports") + 1:] == ["8000"] * 8
    report = serve.plan_report(out, plan)
    assert report["instances"]["main"]["proxy"]["host"] == "node01" and report["hosts"]["node12"]["rank"] == 3


def test_per_host_overrides_reach_the_argv_and_the_peer_check():
    groups, hv = inventory(4)
    hv["node04"]["npuops_vllm_overrides"] = {"data_parallel_address": "10.0.0.99"}
    hv["node02"]["npuops_env_overrides"] = {"HCCL_BUFFSIZE": 2048}
    tier, model, opts = rendered("4node_dp", "kimi_k3_w4a8")
    plan = topology.plan_topology(groups, hv, tier)
    out = serve.serve_containers(plan, hv, tier, model, opts)
    assert out["node04"]["engine"]["peers"] == ["10.0.0.99:13345"]  # the tutorial's RPC_PORT
    assert out["node02"]["engine"]["env"]["HCCL_BUFFSIZE"] == "2048"
    hv["node03"]["npuops_vllm_overrides"] = {"max_num_seq": 8}
    with pytest.raises(AnsibleFilterError, match=r"host node03: unknown vllm serve option 'max_num_seq' \(did you mean "
                                                 r"max_num_seqs"):
        serve.serve_containers(plan, hv, tier, model, opts)


def preview(action, started=True, changes=()):
    return {"action": action, "changes": list(changes), "started_at": "t0" if started else None}


def test_only_the_groups_that_change_restart_and_the_lines_say_why():
    _out, plan, hv, _t = containers("8p8d_pd", 16, extra_groups=lambda g: {"prefill": g["npu_nodes"][:8],
                                                                           "decode": g["npu_nodes"][8:]},
                                    npuops_proxy_host="node01")
    for h in plan["hosts"]:
        hv[h]["p"] = preview("none")
    hv["node12"]["p"] = preview("recreate", changes=["--max-num-seqs: 16 -> 8"])
    d = serve.serve_restarts(hv, plan, "p", active=list(plan["hosts"]))
    assert d["restart"] == ["main/decode"] and d["restart_hosts"] == ["node%02d" % i for i in range(9, 17)]
    assert d["lines"][0] == "node12 (recreate): --max-num-seqs: 16 -> 8"
    assert "node09 (restart with its group main/decode)" in d["lines"]
    assert d["interrupts"] == ["main"] and d["interrupts_service"] and d["problems"] == []
    hv["node10"]["p"] = preview("start", started=False)  # an engine of the group is down: the group is not serving
    d = serve.serve_restarts(hv, plan, "p", active=list(plan["hosts"]))
    assert d["interrupts"] == [] and not d["interrupts_service"]
    for h in plan["hosts"]:
        hv[h]["p"] = preview("none")
    assert serve.serve_restarts(hv, plan, "p", active=list(plan["hosts"]))["restart"] == []
    d = serve.serve_restarts(hv, plan, "p", force=["main/prefill"], active=list(plan["hosts"])[1:])
    assert d["restart"] == ["main/prefill"] and d["problems"] == [
        "node01: not in the play any more (unreachable or failed before this stage)"]


def test_a_change_in_one_of_two_instances_does_not_interrupt_the_service():
    groups, hv = inventory(8)
    for i, h in enumerate(groups["npu_nodes"]):
        hv[h].update(npuops_instance="a" if i < 4 else "b", p=preview("none"))
    plan = topology.plan_topology(groups, hv, tier_spec("4node_dp"))
    hv["node06"]["p"] = preview("recreate", changes=["image: x -> y"])
    d = serve.serve_restarts(hv, plan, "p")
    assert d["restart"] == ["b/main"] and d["interrupts"] == ["b"] and not d["interrupts_service"]


def test_hosts_of_the_last_deployment_that_the_plan_lost_are_named():
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model.serve import deployment_record, serve_leftovers
    plan = {"tier": "4node_dp", "hosts": {"n1": {"instance": "main"}, "n2": {"instance": "main"}}}
    assert deployment_record(plan) == {"tier": "4node_dp", "hosts": {"n1": "main", "n2": "main"}}
    last = {"tier": "4node_dp", "hosts": {"n1": "main", "n2": "main", "n5": "b"}}
    [line] = serve_leftovers(last, plan)
    assert line.startswith("n5 ran an engine of instance b in the last deployment and is no longer in the inventory")
    assert serve_leftovers({}, plan) == [] and serve_leftovers(deployment_record(plan), plan) == []


def test_the_deploy_waits_as_long_as_the_engine_allows_its_ranks():
    """The deploy's /health wait must not give up on a start the engine itself still allows
    (VLLM_ENGINE_READY_TIMEOUT_S, 7200 s in the vLLM-Ascend Kimi-K3 tutorial)."""
    import os
    import yaml
    from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog
    with open(os.path.join(catalog.ROLES_DIR, "defaults", "defaults", "main", "inventory.yml")) as f:
        wait = yaml.safe_load(f)["npuops_serve_ready_timeout"]
    from ansible_collections.npuops.ascend.plugins.plugin_utils import recipes
    assert recipes.load("kimi_k3_tutorial_4node_a3")["env"]["VLLM_ENGINE_READY_TIMEOUT_S"] == "7200"
    assert wait >= 7200


def test_4p2d_from_the_inventory_sizes_ranks_ports_the_connector_and_the_proxy():
    """xPyD: 4 prefill + 2 decode nodes of the 8p8d_pd tier (npuops_prefill_nodes / npuops_decode_nodes). Expected
    values typed from the recipe's layout (launch_online_dp.py: one DP rank per node, --data-parallel-size the side's
    DP, kv side channel kv_port + dp_rank * TP)."""
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model import inventory as inventory_filter
    groups, hv = inventory(6)
    groups.update(prefill=groups["npu_nodes"][:4], decode=groups["npu_nodes"][4:])
    for h in hv:
        hv[h].update(npuops_proxy_host="node01", npuops_prefill_nodes=4, npuops_decode_nodes="2")
    base, model, opts = rendered("8p8d_pd", "kimi_k3_w4a8")
    tier = inventory_filter.tier_document("8p8d_pd", opts["recipe"], hv, "node01")
    assert [(g["name"], g["nodes"], g["dp"]) for g in tier["groups"]] == [("prefill", 4, 4), ("decode", 2, 2)]
    plan = topology.plan_topology(groups, hv, tier)
    assert plan["instances"]["main"]["shape"] == "4P2D"
    out = serve.serve_containers(plan, hv, tier, model, opts)
    p3, d1 = out["node04"]["engine"], out["node06"]["engine"]
    assert flag(p3["command"], "--data-parallel-size") == "4" and flag(p3["command"], "--data-parallel-rank") == "3"
    assert flag(d1["command"], "--data-parallel-size") == "2" and flag(d1["command"], "--data-parallel-rank") == "1"
    assert plan["hosts"]["node04"]["kv_ports"] == [36048, 36063] and plan["hosts"]["node06"]["kv_ports"] == [36216, 36231]
    both = {"prefill": {"dp_size": 4, "tp_size": 16}, "decode": {"dp_size": 2, "tp_size": 16}}
    for c in (p3, d1):
        assert json.loads(flag(c["command"], "--kv-transfer-config"))["kv_connector_extra_config"] == both
    assert [d["why"] for d in d1["recipe_diff"] if d["key"] == "--kv-transfer-config"] == [
        "deviation pd_sizes_from_the_plan, deviation engine_id"]
    proxy = out["node01"]["proxy"]["command"]
    assert proxy[proxy.index("--prefiller-hosts") + 1:proxy.index("--prefiller-ports")] == [
        "10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"]
    assert proxy[proxy.index("--decoder-hosts") + 1:proxy.index("--decoder-ports")] == ["10.0.0.15", "10.0.0.16"]
    # at 8P8D the row changes nothing: the recipe's own numbers
    out8 = containers("8p8d_pd", 16, extra_groups=lambda g: {"prefill": g["npu_nodes"][:8], "decode": g["npu_nodes"][8:]},
                      npuops_proxy_host="node01")[0]
    assert [d["why"] for d in out8["node12"]["engine"]["recipe_diff"] if d["key"] == "--kv-transfer-config"] == [
        "deviation engine_id"]


def eight_and_eight(groups):
    return {"prefill": groups["npu_nodes"][:8], "decode": groups["npu_nodes"][8:]}


def test_the_memcache_kv_pool_runs_the_pages_prefill_connector_and_a_metaservice_first():
    """npuops_kv_pool memcache on the 8P8D recipe: the prefill side runs the page's MultiConnector as published (no
    no_memcache_* row), reads mmc-local.conf, and the proxy host runs the MetaService the page starts (section
    5.1.2.1) with mmc-meta.conf; the files carry the keys of vllm-ascend's kv_pool.md."""
    out, plan, hv, tier = containers("8p8d_pd", 16, extra_groups=eight_and_eight, npuops_proxy_host="node01",
                                     npuops_kv_pool="memcache")
    p, d = out["node03"]["engine"], out["node12"]["engine"]
    assert json.loads(flag(p["command"], "--kv-transfer-config")) == {
        "kv_connector": "MultiConnector", "kv_role": "kv_producer", "engine_id": "prefill-2",
        "kv_connector_extra_config": {"connectors": [
            {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": "36000",
             "kv_connector_extra_config": {"prefill": {"dp_size": 8, "tp_size": 16},
                                           "decode": {"dp_size": 8, "tp_size": 16}}},
            {"kv_connector": "AscendStoreConnector", "kv_role": "kv_producer",
             "kv_connector_extra_config": {"backend": "memcache", "lookup_rpc_port": "0"}}]}}
    assert p["env"]["MMC_LOCAL_CONFIG_PATH"] == "/etc/npuops/mmc-local.conf" and p["env"]["PYTHONHASHSEED"] == "0"
    assert "/etc/npuops/mmc-local.conf:/etc/npuops/mmc-local.conf:ro" in p["mounts"]
    assert p["files"] == [{"path": "/etc/npuops/mmc-local.conf", "content": (
        "ock.mmc.meta_service_url = tcp://10.0.0.11:5000\n"
        "ock.mmc.local_service.config_store_url = tcp://10.0.0.11:6000\n"
        "ock.mmc.log_level = error\n"
        "ock.mmc.local_service.world_size = 256\n"
        "ock.mmc.local_service.protocol = device_sdma\n"
        "ock.mmc.local_service.dram.size = 1GB\n"
        "ock.mmc.tls.enable = false\n"
        "ock.mmc.config_store.tls.enable = false\n")}]
    assert not [x for x in p["recipe_diff"] if "no_memcache" in (x["why"] or "")]
    assert "MMC_LOCAL_CONFIG_PATH" not in d["env"] and d["files"] == []
    meta = out["node01"]["kv_pool"]
    assert meta["command"] == ["python", "-c", "from memcache_hybrid import MetaService; MetaService.main()"]
    assert meta["env"]["MMC_META_CONFIG_PATH"] == "/etc/npuops/mmc-meta.conf" and meta["devices"] == []
    assert meta["files"][0]["content"] == ("ock.mmc.meta_service_url = tcp://10.0.0.11:5000\n"
                                           "ock.mmc.meta_service.config_store_url = tcp://10.0.0.11:6000\n"
                                           "ock.mmc.meta_service.metrics_url = 10.0.0.11:8090\n"
                                           "ock.mmc.log_level = error\n"
                                           "ock.mmc.tls.enable = false\n"
                                           "ock.mmc.config_store.tls.enable = false\n")
    assert plan["members"]["node01"] == ["engine", "proxy", "kv_pool", "prometheus", "load"]
    assert serve.kv_pool_problems(out) == []
    # one host's override makes the pool's engines disagree: named
    hv["node05"]["npuops_env_overrides"] = {"PYTHONHASHSEED": "1"}
    base, model, opts = rendered("8p8d_pd", "kimi_k3_w4a8")
    again = serve.serve_containers(plan, hv, tier, model, opts)
    assert serve.kv_pool_problems(again) == [
        "instance main: PYTHONHASHSEED must be set and the same on every engine of the memcache KV pool (0 on node01, "
        "node02, node03, node04, node06, node07, node08; 1 on node05); set it once for all of them "
        "(npuops_env_overrides in group_vars)"]


def test_a_restore_takes_the_previous_spec_but_refuses_one_that_moved_ports_or_names():
    engine = {"name": "vllm", "image": "new", "command": ["vllm", "serve", "/m", "--host", "10.0.0.11", "--port",
                                                          "8000", "--served-model-name", "kimi-k3", "--block-size",
                                                          "64"],
              "env": {"A": "2"}, "ready_url": "http://10.0.0.11:8000/health", "peers": []}
    before = {"exists": True, "spec": {"image": "old", "command": ["vllm", "serve", "/m", "--host", "10.0.0.11",
                                                                   "--port", "8000", "--served-model-name", "kimi-k3",
                                                                   "--block-size", "128"],
                                       "env": {"A": "1"}, "mounts": ["/m:/m:ro"], "labels": {"io.npuops.role": "l"}}}
    got = serve.serve_previous(engine, "node01", before)
    assert got["image"] == "old" and got["command"][-1] == "128" and got["env"] == {"A": "1"}
    assert got["ready_url"] == engine["ready_url"] and got["mounts"] == ["/m:/m:ro"]
    moved = dict(before, spec=dict(before["spec"], command=[w if w != "8000" else "8100" for w in
                                                            before["spec"]["command"]]))
    with pytest.raises(AnsibleFilterError, match=r"node01: the change also moves --port \(8100 -> 8000\)"):
        serve.serve_previous(engine, "node01", moved)
    with pytest.raises(AnsibleFilterError, match="node01: its engine vllm had no npuops spec before the restart"):
        serve.serve_previous(engine, "node01", {"exists": True, "spec": None})


def test_a_configuration_that_answers_wrongly_is_replaced_by_the_last_that_passed():
    from ansible_collections.npuops.ascend.plugins.module_utils import verdict
    before = {"config": "cfg-old", "engines": {"node01": {"vllm": {"exists": True, "spec": {"command": ["old"]}}}}}
    good = {"node01": {"vllm": {"exists": True, "spec": {"command": ["good"]}}}}
    record = verdict.record(None, "a", "cfg-good", "answers", verdict.PASSED, "ok", "t1", good)
    # what ran before passed: it comes back
    passed = verdict.record(record, "a", "cfg-old", "answers", verdict.PASSED, "ok", "t2")
    got = serve.restore_source(before, passed, ["answers"])
    assert got["engines"] == before["engines"] and got["why"] == "the configuration it ran before, which passed its gates"
    # what ran before was never judged (an interrupted rollout's) or failed: the last that passed comes back
    got = serve.restore_source(before, record, ["answers"])
    assert got["engines"] == good and got["config"] == "cfg-good"
    assert got["why"] == "the last configuration that passed its gates (cfg-good, at t1)"
    failed = verdict.record(record, "a", "cfg-old", "answers", verdict.FAILED, "golden 0.00", "t3")
    assert serve.restore_source(before, failed, ["answers"])["config"] == "cfg-good"
    # no record of any that passed: what ran before, said so
    got = serve.restore_source(before, None, ["answers"])
    assert got["engines"] == before["engines"] and got["why"] == "the configuration it ran before, which no gate judged"
    # no gate asked: what ran before
    assert serve.restore_source(before, record, [])["config"] == "cfg-old"
