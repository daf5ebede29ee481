"""The example inventories describe real clusters: they are only used with playbooks that contact no host."""
import json
import re

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import container
from npuops_sim.testing import BIN, run


@pytest.mark.parametrize("inventory,hosts,endpoint", [
    ("a3-2node", 2, "http://192.168.100.11:8000"),
    ("a3-4node", 4, "http://192.168.100.11:8000"),
    ("a3-8p8d", 16, "http://192.168.100.11:8080"),
    ("a3-8p8d-kv-pool", 16, "http://192.168.100.11:8080"),
    ("a3-8node-ha", 8, "http://192.168.100.250:8000"),
    ("a3-8node-canary", 8, "http://192.168.100.250:8000"),
    ("a2-8node", 8, "http://192.168.110.11:8000"),
    ("a3-8node-1m", 8, "http://192.168.120.11:8000"),
    ("a3-4p2d", 6, "http://192.168.130.11:8080"),
    ("a3-4node-dspark", 4, "http://192.168.100.11:8000"),
    ("a3-4p4d", 8, "http://192.168.140.11:8080"),
    ("sample", 4, "http://192.168.100.11:8000"),  # every variable, commented with its default
])
def test_plan_of_each_example_inventory(tmp_path, inventory, hosts, endpoint):
    out = tmp_path / "plan.json"
    run([BIN + "/ansible-playbook", "-i", "inventories/" + inventory, "playbooks/plan.yml",
         "-e", "plan_output=%s" % out])
    plan = json.loads(out.read_text())
    assert len(plan["hosts"]) == hosts and plan["endpoint"] == endpoint
    # what each host runs is its recipe plus only rows of the deviations table (the example inventories override
    # nothing, but the canary's instance b names its own model)
    for host, entry in plan["hosts"].items():
        assert entry["recipe"] and all((d["why"] or "").startswith("deviation ") or (
            inventory == "a3-8node-canary" and d["key"] == "--served-model-name") or (
            inventory == "a3-4node-dspark" and d["key"] == "--speculative-config"
            and d["why"] == "npuops_draft inferact_kimi_k3_dspark (the Kimi-K3 tutorial, section 5.2)")
            for d in entry["recipe_diff"]), host
    leaders = [h for h, e in plan["hosts"].items() if e["role"] == "leader"]
    assert len(leaders) == (2 if inventory in ("a3-8p8d", "a3-8p8d-kv-pool", "a3-8node-ha", "a3-8node-canary",
                                                "a3-4p2d", "a3-4p4d") else 1)
    if inventory == "a3-4p4d":
        assert_the_4p4d_page_runs_as_published(plan)
    if inventory == "a3-4p2d":
        assert plan["instances"]["main"]["shape"] == "4P2D"
        assert plan["instances"]["main"]["proxy"]["container"]["argv"][-3:] == ["--decoder-ports", "8000", "8000"]
    if inventory == "a3-8node-ha":
        assert plan["instances"]["a"]["endpoint"] == "http://192.168.100.11:8000"
        assert plan["instances"]["b"]["endpoint"] == "http://192.168.100.15:8000"
    if inventory == "a3-8node-canary":
        assert_the_canary_serves_two_weight_sets(plan)
    if inventory == "a3-8p8d-kv-pool":
        assert_the_prefill_side_joins_the_memcache_pool(plan)
    if inventory == "a3-4node-dspark":
        assert_every_engine_drafts_as_the_tutorial_writes(plan)


def flags_of(argv):
    return container.argv_flags(argv)[1]


# The v0.26.0rc line's Kimi-K3 page, section 5.1 (Atlas 800 A3, four-node), as vllm-project/vllm-ascend@a0d792e2 has
# it, typed here from the page: node 0's flags and the environment every node exports. The v0.27.1rc line carries it
# (#17155 edits it), adding `unset LD_PRELOAD`.
V026_NODE0_FLAGS = {
    "--served-model-name": "kimi-k3", "--port": "8000", "--allowed-local-media-path": "/", "--trust-remote-code": True,
    "--tensor-parallel-size": "16", "--data-parallel-size": "4", "--data-parallel-size-local": "1",
    "--data-parallel-address": "192.168.100.11", "--data-parallel-rpc-port": "13389", "--enable-prefix-caching": True,
    "--enable-expert-parallel": True, "--max-num-seqs": "16", "--max-model-len": "131072",
    "--max-num-batched-tokens": "24576", "--gpu-memory-utilization": "0.9",
    "--mm-encoder-tp-mode": "data", "--enable-auto-tool-choice": True, "--reasoning-parser": "kimi_k3",
    "--tool-call-parser": "kimi_k3", "--tokenizer-mode": "kimi_k3",
    # deviation listen_on_the_node_address (the page names no --host)
    "--host": "192.168.100.11"}
V026_ENV = {"HCCL_BUFFSIZE": "800", "HCCL_IF_IP": "192.168.100.11", "HCCL_SOCKET_IFNAME": "enp189s0f0",
            "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15", "GLOO_SOCKET_IFNAME": "enp189s0f0",
            "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
            # deviations vllm_host_ip, tp_socket_ifname; and on the v0.27.1rc line no_jemalloc_preload (#17155)
            "VLLM_HOST_IP": "192.168.100.11", "TP_SOCKET_IFNAME": "enp189s0f0"}


@pytest.mark.parametrize("image, recipe, line", [
    ("quay.io/ascend/vllm-ascend:v0.27.1rc1-a3", "vllm_ascend_kimi_k3_4node_a3_v026", "0.27.1rc"),
    ("quay.io/ascend/vllm-ascend:nightly-releases-v0.27.1rc-openeuler", "vllm_ascend_kimi_k3_4node_a3_v026",
     "0.27.1rc"),
    ("quay.io/ascend/vllm-ascend:kimi-k3-a3", "vllm_ascend_kimi_k3_4node_a3", "0.23.0"),
    ("quay.io/ascend/vllm-ascend:nightly-main-a3", "kimi_k3_tutorial_4node_a3", "main"),
])
def test_the_plan_chooses_the_recipe_of_the_images_line(tmp_path, image, recipe, line):
    plan, proc = plan_of(tmp_path, "a3-4node", "-e", "npuops_image=" + image)
    assert {h["recipe"] for h in plan["hosts"].values()} == {recipe}
    choice = plan["instances"]["main"]["recipe"]
    assert (choice["recipe"], choice["line"], choice["note"]) == (recipe, line, None)
    assert "instance main: recipe %s" % recipe in " ".join(proc.stdout.split())
    if recipe != "vllm_ascend_kimi_k3_4node_a3_v026":
        return
    node0 = plan["hosts"]["a3-node-01"]["container"]
    flags = flags_of(node0["argv"])
    assert dict((k, flags[k]) for k in V026_NODE0_FLAGS) == V026_NODE0_FLAGS
    assert float(flags["--mm-processor-cache-gb"]) == 0  # the page's 0, typed as vLLM types it (a float)
    assert json.loads(flags["--compilation-config"]) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert json.loads(flags["--additional-config"]) == {"enable_cpu_binding": True, "enable_flashcomm1": True}
    assert json.loads(flags["--limit-mm-per-prompt"]) == {"vision_chunk": 2}
    # the page drafts with DSpark; without npuops_draft no speculative config (deviation no_draft)
    assert "--speculative-config" not in flags
    # the mixed deployment on A3 leaves HCCL_OP_EXPANSION_MODE unset (HCCL uses AICPU, #15622), and the v0.27.1rc
    # line clears the image's jemalloc preload (#17155)
    assert node0["env"] == dict(V026_ENV, LD_PRELOAD="")
    worker = flags_of(plan["hosts"]["a3-node-03"]["container"]["argv"])
    assert (worker["--headless"], worker["--data-parallel-start-rank"], worker["--data-parallel-address"]) == (
        True, "2", "192.168.100.11")
    reasons = dict((d["key"], d["why"]) for d in plan["hosts"]["a3-node-01"]["recipe_diff"])
    assert reasons["LD_PRELOAD"] == "deviation no_jemalloc_preload"
    assert reasons["--speculative-config"] == "deviation no_draft"


def test_an_image_newer_than_every_recipe_plans_with_the_newest_and_an_older_one_is_refused(tmp_path):
    plan, proc = plan_of(tmp_path, "a3-4node", "-e", "npuops_image=quay.io/ascend/vllm-ascend:v0.32.0-a3")
    choice = plan["instances"]["main"]["recipe"]
    assert (choice["recipe"], choice["line"]) == ("kimi_k3_tutorial_4node_a3", "0.32.0")
    assert choice["note"] == ("the image's vLLM-Ascend line 0.32.0 is newer than every line recipe "
                              "kimi_k3_tutorial_4node_a3 was validated on (vLLM-Ascend main): it plans with it, the "
                              "newest recipe that fits")
    # the 4P4D page was validated from the v0.26.0rc line on: a v0.23.0 image is refused, naming both
    _plan, proc = plan_of(tmp_path, "a3-4p4d", "-e", "npuops_image=quay.io/ascend/vllm-ascend:kimi-k3-a3",
                          check=False)
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    assert "no recipe of tier 4p4d_pd for model preset kimi_k3_w4a8 was validated on the image's vLLM-Ascend line " \
           "0.23.0 (older than every one of them): vllm_ascend_kimi_k3_4p4d_a3 (vLLM-Ascend 0.26.0rc, 0.27.1rc)" in text, \
        text[-2000:]


def test_the_16_node_pd_page_says_upstream_moved_on(tmp_path):
    _plan, proc = plan_of(tmp_path, "a3-8p8d")
    text = " ".join(proc.stdout.split())
    assert "superseded upstream: 4P4D on 8 x A3 without the memcache KV pool (tier 4p4d_pd, recipe " \
           "vllm_ascend_kimi_k3_4p4d_a3)" in text, text[-3000:]


def assert_the_4p4d_page_runs_as_published(plan):
    """The v0.26.0rc line's page, section 5.2 (eight-node PD separation, Atlas 800 A3), typed from the page."""
    prefill, decode = (plan["hosts"][h]["container"] for h in ("a3-node-01", "a3-node-05"))
    pf, df = flags_of(prefill["argv"]), flags_of(decode["argv"])
    for flags in (pf, df):
        assert (flags["--data-parallel-size"], flags["--tensor-parallel-size"], flags["--seed"],
                flags["--max-model-len"], flags["--max-num-batched-tokens"], flags["--max-num-seqs"],
                flags["--gpu-memory-utilization"], flags["--quantization"], flags["--mamba-cache-mode"],
                flags["--safetensors-load-strategy"], flags["--tokenizer-mode"]) == (
            "4", "16", "1024", "133120", "8192", "16", "0.9", "ascend", "align", "prefetch", "kimi_k3")
    assert pf["--enforce-eager"] is True and "--compilation-config" not in pf
    assert json.loads(df["--compilation-config"]) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    # FlashComm1 off beside multistream overlap on the prefill side (deviation, #15622's rule); the decode template
    # as published
    assert json.loads(pf["--additional-config"]) == {"recompute_scheduler_enable": False, "enable_flashcomm1": False,
                                                     "multistream_overlap_shared_expert": True}
    assert json.loads(df["--additional-config"]) == {"recompute_scheduler_enable": False,
                                                     "multistream_overlap_shared_expert": True}
    pkv, dkv = json.loads(pf["--kv-transfer-config"]), json.loads(df["--kv-transfer-config"])
    assert pkv["kv_connector"] == "MultiConnector" and [c["kv_connector"] for c in pkv["kv_connector_extra_config"][
        "connectors"]] == ["MooncakeConnectorV1"]
    assert pkv["kv_connector_extra_config"]["connectors"][0]["kv_port"] == "36000" and dkv["kv_port"] == "36200"
    assert dkv["kv_connector"] == "MooncakeConnectorV1" and dkv["kv_role"] == "kv_consumer"
    assert dkv["kv_connector_extra_config"] == {"prefill": {"dp_size": 4, "tp_size": 16},
                                                "decode": {"dp_size": 4, "tp_size": 16}}
    # prefill leaves HCCL_OP_EXPANSION_MODE unset (AICPU), decode sets AIV; fabric memory on both (kv_pool.md)
    assert "HCCL_OP_EXPANSION_MODE" not in prefill["env"] and decode["env"]["HCCL_OP_EXPANSION_MODE"] == "AIV"
    for env in (prefill["env"], decode["env"]):
        assert (env["ASCEND_ENABLE_USE_FABRIC_MEM"], env["HCCL_BUFFSIZE"], env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"],
                env["LD_PRELOAD"]) == ("1", "1024", "30000", "")
        assert "LD_LIBRARY_PATH" not in env  # deviation image_library_path
    assert prefill["env"]["PYTHONHASHSEED"] == "0" and "PYTHONHASHSEED" not in decode["env"]
    assert plan["instances"]["main"]["shape"] == "4P4D" and plan["instances"]["main"]["kv_pool"] is None


# the Kimi-K3 tutorial's section 5.2, as published, with its <DSPARK_DRAFT_PATH> the inventory's npuops_draft_dir
TUTORIAL_SPECULATIVE_CONFIG = {"method": "dspark", "model": "/data/models/Kimi-K3-DSpark", "num_speculative_tokens": 7,
                               "draft_tensor_parallel_size": 16, "max_model_len": 4096,
                               "draft_sample_method": "greedy", "enforce_eager": True}


def assert_every_engine_drafts_as_the_tutorial_writes(plan):
    """"Add the same speculative config to the node 0 and headless worker commands"; the draft is mounted at the same
    path on every node."""
    for host in ("a3-node-01", "a3-node-02", "a3-node-03", "a3-node-04"):
        container = plan["hosts"][host]["container"]
        assert json.loads(argv_value(container["argv"], "--speculative-config")[0]) == TUTORIAL_SPECULATIVE_CONFIG
        assert "/data/models/Kimi-K3-DSpark:/data/models/Kimi-K3-DSpark:ro" in container["mounts"]
    assert plan["instances"]["main"]["model"]["draft"] == "inferact_kimi_k3_dspark"


@pytest.mark.parametrize("draft, tokens", [("radixark_kimi_k3_dspark", 7), ("inferact_kimi_k3_dspark", 7),
                                           ("inferact_kimi_k3_dspark_block5", 5)])
def test_the_plan_shows_the_speculative_config_of_each_draft_preset(tmp_path, draft, tokens):
    """The tutorial's three drafts (section 3.1): seven speculative tokens for the RadixArk GQA and the Inferact MLA
    draft, five for Block5; the rest as its section 5.2 writes it."""
    out = tmp_path / "plan.json"
    run([BIN + "/ansible-playbook", "-i", "inventories/a3-4node-dspark", "playbooks/plan.yml", "-e",
         "plan_output=%s" % out, "-e", json.dumps({"npuops_draft": draft, "npuops_draft_dir": "/data/models/d"})])
    plan = json.loads(out.read_text())
    for host, entry in plan["hosts"].items():
        config = json.loads(argv_value(entry["container"]["argv"], "--speculative-config")[0])
        assert config == dict(TUTORIAL_SPECULATIVE_CONFIG, model="/data/models/d", num_speculative_tokens=tokens), host


def test_a_draft_that_breaks_a_rule_is_refused_naming_the_rule(tmp_path):
    """k = 16 is 17 query tokens per request, over the 16 of Ascend's fused attention; a draft TP that is neither 1
    nor the target's; a draft longer than its target: refused before any host is contacted, each naming its rule."""
    proc = run([BIN + "/ansible-playbook", "-i", "inventories/a3-4node-dspark", "playbooks/plan.yml", "-e",
                "plan_output=%s" % (tmp_path / "plan.json"), "-e", json.dumps({"npuops_draft_overrides": {
                    "num_speculative_tokens": 16, "draft_tensor_parallel_size": 8, "max_model_len": 262144}})],
               check=False)
    assert proc.returncode != 0 and not (tmp_path / "plan.json").exists()
    out = proc.stdout
    assert "The inventory has 3 problem(s):" in out, out[-3000:]
    assert ("draft inferact_kimi_k3_dspark: num_speculative_tokens = 16: 1 + k = 17 query tokens per request exceed "
            "the 16 that Ascend's fused attention takes") in out
    assert "draft_tensor_parallel_size 8 on group main (TP16): vLLM takes 1 or the target's tensor parallel size" in out
    assert "max_model_len 262144 is larger than the target's 133120" in out


def assert_the_prefill_side_joins_the_memcache_pool(plan):
    """The Kimi-K3 page's 8P8D prefill command as published (releases/v0.23.0, section 5.1.2.1): MultiConnector with
    MooncakeConnectorV1 and AscendStoreConnector (backend memcache), the pool's environment; decode unchanged."""
    prefill, decode = plan["hosts"]["a3-node-03"]["container"], plan["hosts"]["a3-node-12"]["container"]
    kv = json.loads(argv_value(prefill["argv"], "--kv-transfer-config")[0])
    assert kv["kv_connector"] == "MultiConnector" and kv["kv_role"] == "kv_producer"
    assert [c["kv_connector"] for c in kv["kv_connector_extra_config"]["connectors"]] == [
        "MooncakeConnectorV1", "AscendStoreConnector"]
    assert kv["kv_connector_extra_config"]["connectors"][1]["kv_connector_extra_config"]["backend"] == "memcache"
    env = prefill["env"]
    assert env["MMC_LOCAL_CONFIG_PATH"] == "/etc/npuops/mmc-local.conf" and env["PYTHONHASHSEED"] == "0"
    assert env["ASCEND_ENABLE_USE_FABRIC_MEM"] == "1" and env["HCCL_EXEC_TIMEOUT"] == "204"
    assert "/etc/npuops/mmc-local.conf:/etc/npuops/mmc-local.conf:ro" in prefill["mounts"]
    assert json.loads(argv_value(decode["argv"], "--kv-transfer-config")[0])["kv_connector"] == "MooncakeConnectorV1"
    assert "MMC_LOCAL_CONFIG_PATH" not in decode["env"]
    meta = plan["instances"]["main"]["kv_pool"]
    assert meta["host"] == "a3-node-01" and meta["container"]["argv"] == [
        "python", "-c", "from memcache_hybrid import MetaService; MetaService.main()"]
    assert meta["container"]["env"]["MMC_META_CONFIG_PATH"] == "/etc/npuops/mmc-meta.conf"


argv_value = container.flag_words  # the words after a flag up to the next flag


def assert_the_canary_serves_two_weight_sets(plan):
    """The planning article's usage B: instance b serves other weights under its own name, and the service's too."""
    assert plan["instances"]["a"]["model"] == {"served_model_name": "kimi-k3", "preset": "kimi_k3_w4a8",
                                               "model_dir": "/data/models/Kimi-K3-W4A8",
                                               "recipe": "kimi_k3_tutorial_4node_a3", "draft": None,
                                               "num_speculative_tokens": None}
    assert plan["instances"]["b"]["model"] == {"served_model_name": "kimi-k3-w4a8-v2", "preset": "kimi_k3_w4a8",
                                               "model_dir": "/data/models/Kimi-K3-W4A8-v2",
                                               "recipe": "kimi_k3_tutorial_4node_a3", "draft": None,
                                               "num_speculative_tokens": None}
    for n in range(1, 9):
        host = plan["hosts"]["a3-node-%02d" % n]
        argv, mounts = host["container"]["argv"], host["container"]["mounts"]
        if n <= 4:
            assert argv[:3] == ["vllm", "serve", "/data/models/Kimi-K3-W4A8"], argv
            assert argv_value(argv, "--served-model-name") == ["kimi-k3"]
            assert "/data/models/Kimi-K3-W4A8:/data/models/Kimi-K3-W4A8:ro" in mounts
            assert not any("W4A8-v2" in m for m in mounts)
        else:
            assert argv[:3] == ["vllm", "serve", "/data/models/Kimi-K3-W4A8-v2"], argv
            # its own name first (vLLM answers with it), the service's second (vLLM accepts it)
            assert argv_value(argv, "--served-model-name") == ["kimi-k3-w4a8-v2", "kimi-k3"]
            assert "/data/models/Kimi-K3-W4A8-v2:/data/models/Kimi-K3-W4A8-v2:ro" in mounts
            assert "/data/models/Kimi-K3-W4A8:/data/models/Kimi-K3-W4A8:ro" not in mounts
            row = [d for d in host["recipe_diff"] if d["key"] == "--served-model-name"][0]
            assert row == {"kind": "flag", "key": "--served-model-name", "recipe": "kimi-k3",
                           "runs": "kimi-k3-w4a8-v2 kimi-k3",
                           "why": "npuops_model_overrides.served_model_name, deviation service_model_name"}


def test_a_broken_inventory_fails_once_with_every_problem(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("""
all:
  vars:
    npuops_tier: 4node_dp
    npuops_model: kimi_k3_w4a8
    npuops_model_dir: models/k3
    npuops_image: quay.io/ascend/vllm-ascend:v0.23.0-a3
  children:
    npu_nodes:
      hosts:
        n1: {npuops_node_ip: 10.0.0.1, npuops_nic: eth0}
        n2: {npuops_node_ip: 10.0.0.1, npuops_nic: eth0, npuops_preflight_strict: "flase"}
        n3: {npuops_node_ip: 10.0.0.3}
""")
    proc = run([BIN + "/ansible-playbook", "-i", str(inv), "playbooks/plan.yml", "-e", "plan_output=%s" %
                (tmp_path / "plan.json")], check=False)
    assert proc.returncode != 0
    text = proc.stdout
    assert text.count("fatal:") == 1  # once, for the whole inventory
    for expected in ("needs 4 hosts per instance in npu_nodes, the inventory has 3",
                     "npuops_model_dir = 'models/k3' must be an absolute path",
                     "host n2: npuops_node_ip 10.0.0.1 is also the address of n1",
                     "host n2: npuops_preflight_strict = 'flase' is not a boolean",
                     "host n3: npuops_nic = None must name the interface"):
        assert expected in text, expected


def test_a_yaml_error_in_group_vars_names_its_file_and_line(tmp_path):
    """ansible-core 2.19's host_group_vars turns the parser's error into text without its origin ("YAML parsing
    failed" and nothing else); the collection's vars plugin (ansible.cfg) lets ansible-core's own error through, with
    the file, the line and the source there."""
    import shutil
    inv = tmp_path / "inv"
    shutil.copytree("inventories/a3-4node", str(inv))
    with open(str(inv / "group_vars" / "all.yml"), "a") as f:
        f.write("npuops_vllm_overrides: {max_num_seqs: 8\nnpuops_other: 1\n")
    lines = (inv / "group_vars" / "all.yml").read_text().splitlines()
    proc = run([BIN + "/ansible-playbook", "-i", str(inv), "playbooks/plan.yml"], check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "YAML parsing failed" in text
    assert "Origin: %s/group_vars/all.yml:%d:" % (inv, len(lines)) in text, text[-2000:]
    assert "WARNING" not in text.replace("CryptographyDeprecationWarning", "")


def plan_of(tmp_path, inventory, *extra, check=True):
    out = tmp_path / "plan.json"
    proc = run([BIN + "/ansible-playbook", "-i", "inventories/" + inventory, "playbooks/plan.yml",
                "-e", "plan_output=%s" % out] + list(extra), check=check)
    return (json.loads(out.read_text()) if check else None), proc


def test_the_knobs_the_docs_name_are_accepted_and_do_what_they_say(tmp_path):
    """docs/preflight.md says to set npuops_fabric_mem false where LingQu is older than 1.5, docs/weights.md that
    plan.yml's copy time follows npuops_disk_write_mb_s and npuops_fabric_link_gbit; the validator refused all three
    as "not an npuops variable" (nothing declared them). They are rows of the table now."""
    plan, proc = plan_of(tmp_path, "a3-4p4d", "-e", json.dumps(
        {"npuops_fabric_mem": False, "npuops_disk_write_mb_s": 1500, "npuops_fabric_link_gbit": 100}))
    assert "not an npuops variable" not in proc.stdout
    for host, entry in plan["hosts"].items():
        env = entry["container"]["env"]
        assert "ASCEND_ENABLE_USE_FABRIC_MEM" not in env and env["HCCL_INTRA_ROCE_ENABLE"] == "1", host
        assert {"kind": "env", "key": "HCCL_INTRA_ROCE_ENABLE", "recipe": "(absent)", "runs": "1",
                "why": "deviation fabric_mem_fallback_roce"} in entry["recipe_diff"], host
    assert "each at 1500 MB/s (disk write bound: disk 1500 MB/s, link 100 Gbit/s)" in " ".join(proc.stdout.split())
    _plan, proc = plan_of(tmp_path, "a3-4p4d", "-e", '{"npuops_fabric_mem": "flase"}', check=False)
    assert proc.returncode != 0 and "npuops_fabric_mem" in proc.stdout and "'flase'" in proc.stdout


def test_a_boolean_given_as_a_string_on_the_command_line_means_what_it_says(tmp_path):
    plan, _proc = plan_of(tmp_path, "a3-4node", "-e", "npuops_serve_privileged=false")
    assert {h["container"]["privileged"] for h in plan["hosts"].values()} == {False}
    plan, _proc = plan_of(tmp_path, "a3-4node", "-e", "npuops_serve_privileged=true")
    assert {h["container"]["privileged"] for h in plan["hosts"].values()} == {True}
    _plan, proc = plan_of(tmp_path, "a3-4node", "-e", "npuops_serve_privileged=ture", check=False)
    assert proc.returncode != 0  # the role's argument spec refuses it before anything is planned
    assert "argument 'npuops_serve_privileged'" in proc.stdout and "'ture' is not a valid boolean" in proc.stdout


def test_a_1m_context_on_four_nodes_is_refused_naming_the_rule_and_eight_nodes_plan_it(tmp_path):
    """The vLLM-Ascend Kimi-K3 page: "Serving a 1M-token context requires at least eight Atlas 800 A3 (64G x 16)
    nodes" (DP8, --max-model-len 1048576, --max-num-batched-tokens 8192 on every node)."""
    _plan, proc = plan_of(tmp_path, "a3-4node", "-e", '{"npuops_model_overrides": {"max_model_len": 1048576}}',
                          check=False)
    assert proc.returncode != 0
    assert "The tier cannot serve the model as planned:" in proc.stdout
    assert re.search(r"tier 4node_dp, group main \(TP16 x PP1 x DP4\): the KV cache holds \d+ tokens on 64 dies, "
                     r"less than one sequence of max_model_len 1048576", proc.stdout), proc.stdout[-3000:]
    assert "requires at least eight Atlas 800 A3 (64G x 16) nodes (tier 8node_dp, recipe " \
        "vllm_ascend_kimi_k3_8node_a3_1m)" in " ".join(proc.stdout.split())
    plan, _proc = plan_of(tmp_path, "a3-8node-1m")
    for i in range(1, 9):
        argv = plan["hosts"]["a3-node-%02d" % i]["container"]["argv"]
        assert argv[argv.index("--data-parallel-size") + 1] == "8" and argv[argv.index("--max-model-len") + 1] == \
            "1048576" and argv[argv.index("--max-num-batched-tokens") + 1] == "8192"
        assert (argv[argv.index("--data-parallel-start-rank") + 1] if i > 1 else None) == (str(i - 1) if i > 1
                                                                                            else None)
        assert ("--data-parallel-start-rank" in argv) == ("--headless" in argv) == (i > 1)


def test_the_plan_shows_an_override_as_a_difference_from_the_recipe(tmp_path):
    """plan.yml names, per host, what differs from the recipe (the tutorial's command) and why."""
    plan, proc = plan_of(tmp_path, "a3-4node", "-e", '{"npuops_model_overrides": {"max_num_seqs": 32}}')
    text = proc.stdout
    for node in ("a3-node-01", "a3-node-02", "a3-node-03", "a3-node-04"):
        assert "%s: recipe kimi_k3_tutorial_4node_a3" % node in text
    assert text.count("--max-num-seqs: 16 -> 32 (npuops_model_overrides.max_num_seqs)") == 4, text[-3000:]
    assert "--host: 0.0.0.0 -> 192.168.100.11 (deviation listen_on_the_node_address)" in text
    assert "NOT EXPLAINED" not in text
    diff = plan["hosts"]["a3-node-02"]["recipe_diff"]
    assert {"kind": "flag", "key": "--max-num-seqs", "recipe": "16", "runs": "32",
            "why": "npuops_model_overrides.max_num_seqs"} in diff


def test_a_typo_in_the_model_overrides_is_an_error_naming_the_known_fields(tmp_path):
    _plan, proc = plan_of(tmp_path, "a3-4node", "-e", '{"npuops_model_overrides": {"max_num_seq": 8}}', check=False)
    assert proc.returncode != 0
    assert "npuops_model_overrides: 'max_num_seq' is not a preset field; the fields are " in proc.stdout
    assert "max_num_seqs" in proc.stdout
    plan, _proc = plan_of(tmp_path, "a3-4node", "-e", '{"npuops_model_overrides": {"max_num_seqs": "8"}}')
    argv = plan["hosts"]["a3-node-01"]["container"]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "8"


def test_the_plan_shows_every_field_each_container_gets(tmp_path):
    plan, _proc = plan_of(tmp_path, "a3-8p8d")
    for entry in plan["hosts"].values():
        assert set(entry["container"]) == {"name", "image", "argv", "env", "devices", "mounts", "shm_size",
                                           "privileged", "labels"}
    proxy = plan["instances"]["main"]["proxy"]
    assert proxy["host"] == "a3-node-01" and proxy["container"]["argv"][1].endswith("load_balance_proxy_server_example.py")


def test_plan_refuses_an_image_whose_vllm_lacks_the_presets_parsers(tmp_path):
    """vLLM 0.23.0 has no kimi_k3 parsers (vllm/reasoning, vllm/tool_parsers); the plain v0.23.0 image's vllm-ascend
    registers none either (the kimi-k3 images do): the recipe of its line (the v0.23.0 page's) cannot run on it, and
    plan.yml fails before anything starts, naming the image, each field and the fix."""
    proc = run([BIN + "/ansible-playbook", "-i", "inventories/a3-4node", "playbooks/plan.yml",
                "-e", "npuops_image=quay.io/ascend/vllm-ascend:v0.23.0-a3",
                "-e", "plan_output=%s" % (tmp_path / "plan.json")], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and not (tmp_path / "plan.json").exists()
    assert "The image cannot serve the command the recipe renders" in out
    assert "the command of recipe vllm_ascend_kimi_k3_4node_a3 sets" in out
    for field in ("reasoning_parser: kimi_k3", "tool_call_parser: kimi_k3"):
        assert field in out
    assert "vLLM 0.23.0" in out and "main(-|$)" in out


@pytest.mark.parametrize("inventory,image", [
    ("a3-4node", "quay.io/ascend/vllm-ascend:nightly-main-a3"),  # the vLLM-Ascend Kimi-K3 tutorial
    ("a3-4node", "quay.io/ascend/vllm-ascend:kimi-k3-a3"),  # the planning article, the upstream Kimi-K3 page
    ("a3-4node", "quay.io/ascend/vllm-ascend:kimi-k3-a3-openeuler@sha256:" + "0f" * 32),  # the page, pinned
    ("a3-2node", "quay.io/ascend/vllm-ascend:kimi-k3.1-pro-a3"),  # the GPUWorks field report
])
def test_every_image_the_references_name_plans(tmp_path, inventory, image):
    plan, _proc = plan_of(tmp_path, inventory, "-e", "npuops_image=" + image)
    assert {h["container"]["image"] for h in plan["hosts"].values()} == {image}


def test_an_unknown_tag_says_what_to_do(tmp_path):
    _plan, proc = plan_of(tmp_path, "a3-4node", "-e", "npuops_image=registry.local/vllm-ascend:k3-custom",
                          check=False)
    assert proc.returncode != 0
    assert "tag 'k3-custom' is not in the image version table" in proc.stdout
    assert "use a listed image line or add this tag's line" in proc.stdout


def test_a_misspelt_setting_a_shared_address_and_a_host_in_two_instances_are_named(tmp_path):
    """Three mistakes that passed plan.yml before: a misspelt key setting (the service then ran without a key), two
    hosts with one ansible_host (preflight later blamed the devices), a host in two instance groups with the counts
    balanced (it silently joined the later one). One run names all three."""
    inv = tmp_path / "hosts.yml"
    hosts = dict(("a3-node-%02d" % i, "{ansible_host: 192.168.100.%d, npuops_node_ip: 192.168.100.%d, "
                  "npuops_nic: enp189s0f0}" % (10 + i, 10 + i)) for i in range(1, 9))
    hosts["a3-node-03"] = "{ansible_host: 192.168.100.12, npuops_node_ip: 192.168.100.13, npuops_nic: enp189s0f0}"
    members = {"a": ["a3-node-01", "a3-node-02", "a3-node-03", "a3-node-04", "a3-node-05"],
               "b": ["a3-node-04", "a3-node-06", "a3-node-07", "a3-node-08"]}
    lines = ["all:", "  vars:", "    npuops_tier: 4node_dp", "    npuops_model: kimi_k3_w4a8",
             "    npuops_model_dir: /data/models/k3", "    npuops_image: quay.io/ascend/vllm-ascend:main-a3",
             "    npuops_servce_api_key: sk-0123456789", "  children:", "    npu_nodes:", "      children:"]
    for name in ("a", "b"):
        lines += ["        instance_%s:" % name, "          vars: {npuops_instance: %s}" % name, "          hosts:"]
        lines += ["            %s: %s" % (h, hosts[h]) for h in members[name]]
    inv.write_text("\n".join(lines) + "\n")
    proc = run([BIN + "/ansible-playbook", "-i", str(inv), "playbooks/plan.yml", "-e", "plan_output=%s" %
                (tmp_path / "plan.json")], check=False)
    text = proc.stdout
    assert proc.returncode != 0 and text.count("fatal:") == 1, text[-3000:]
    assert "npuops_servce_api_key is not an npuops variable (nothing reads it); did you mean npuops_serve_api_key?" \
        in text
    assert "hosts a3-node-02 and a3-node-03 have the same ansible_host 192.168.100.12" in text
    assert "host a3-node-04 is in group instance_a (instance a) and in instance_b" in text
    assert "sk-0123456789" not in text  # the value of a misspelt secret is not shown either
