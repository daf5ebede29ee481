# -*- coding: utf-8 -*-
"""Recipes: what a host runs is the recipe as its source publishes it, plus only the rows of the deviations table and
the operator's own overrides. The expected commands are typed here from the sources, not derived by the planner."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import shlex

import pytest

from ansible_collections.npuops.ascend.plugins.plugin_utils.model import serve, topology
from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog, recipes
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import inventory, rendered

# The vLLM-Ascend Kimi-K3 tutorial, section 5.1, with its variables filled in by hand for node01 (node 0) and node03
# (DP_START_RANK=2): MODEL_PATH=TOKENIZER_PATH=/data/models/k3, LOCAL_IP=10.0.0.1x, NODE0_IP=10.0.0.11,
# SERVICE_PORT=8000, RPC_PORT=13345, DP_SIZE=4, TP_SIZE=16.
TUTORIAL_NODE0 = """vllm serve "/data/models/k3" \\
  --host 0.0.0.0 \\
  --port 8000 \\
  --served-model-name kimi-k3 \\
  --tokenizer "/data/models/k3" \\
  --tokenizer-mode kimi_k3 \\
  --quantization ascend \\
  --safetensors-load-strategy lazy \\
  --tensor-parallel-size 16 \\
  --data-parallel-size 4 \\
  --data-parallel-size-local 1 \\
  --data-parallel-address 10.0.0.11 \\
  --data-parallel-rpc-port 13345 \\
  --enable-expert-parallel \\
  --enable-prefix-caching \\
  --max-model-len 133120 \\
  --max-num-seqs 16 \\
  --max-num-batched-tokens 8192 \\
  --gpu-memory-utilization 0.85 \\
  --reasoning-parser kimi_k3 \\
  --tool-call-parser kimi_k3 \\
  --enable-auto-tool-choice \\
  --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}'"""
TUTORIAL_NODE2 = """vllm serve "/data/models/k3" \\
  --headless \\
  --host 0.0.0.0 \\
  --port 8000 \\
  --served-model-name kimi-k3 \\
  --tokenizer "/data/models/k3" \\
  --tokenizer-mode kimi_k3 \\
  --quantization ascend \\
  --safetensors-load-strategy lazy \\
  --tensor-parallel-size 16 \\
  --data-parallel-size 4 \\
  --data-parallel-size-local 1 \\
  --data-parallel-start-rank 2 \\
  --data-parallel-address 10.0.0.11 \\
  --data-parallel-rpc-port 13345 \\
  --enable-expert-parallel \\
  --enable-prefix-caching \\
  --max-model-len 133120 \\
  --max-num-seqs 16 \\
  --max-num-batched-tokens 8192 \\
  --gpu-memory-utilization 0.85 \\
  --reasoning-parser kimi_k3 \\
  --tool-call-parser kimi_k3 \\
  --enable-auto-tool-choice \\
  --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}'"""
TUTORIAL_ENV = {
    "VLLM_ENGINE_READY_TIMEOUT_S": "7200", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3000",
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "HCCL_BUFFSIZE": "1024", "HCCL_BUFFSIZE_EP": "2048",
    "HCCL_INTRA_PCIE_ENABLE": "1", "HCCL_INTRA_ROCE_ENABLE": "0", "HCCL_OP_EXPANSION_MODE": "AIV",
    "OMP_PROC_BIND": "false", "OPENBLAS_NUM_THREADS": "1",
    "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "GLOO_SOCKET_IFNAME": "enp189s0f0", "TP_SOCKET_IFNAME": "enp189s0f0", "HCCL_SOCKET_IFNAME": "enp189s0f0",
}


def plan_containers(tier_name, preset, recipe_name=None, overrides=None):
    doc = catalog.load("tiers/" + tier_name)
    groups, hv = inventory(doc["nodes"])
    if any(g.get("kv_role") for g in doc["groups"]):
        prefill = doc["groups"][0]["nodes"]
        groups.update(prefill=groups["npu_nodes"][:prefill], decode=groups["npu_nodes"][prefill:])
        for h in hv:
            hv[h]["npuops_proxy_host"] = "node01"
    tier, model, opts = rendered(tier_name, preset, recipe_name, overrides)
    plan = topology.plan_topology(groups, hv, tier)
    return serve.serve_containers(plan, hv, tier, model, opts)


def spec_of(argv):
    return recipes.command_spec(shlex.join(argv), "rendered")


def test_the_tutorials_node0_and_worker_commands_are_what_runs_but_the_listen_address():
    out = plan_containers("4node_dp", "kimi_k3_w4a8")
    node0, node2 = out["node01"]["engine"], out["node03"]["engine"]
    want0 = recipes.command_spec(TUTORIAL_NODE0, "typed")
    want0["host"] = "10.0.0.11"  # deviation listen_on_the_node_address, the only one on the command
    assert spec_of(node0["command"]) == want0
    assert spec_of(node2["command"]) == recipes.command_spec(TUTORIAL_NODE2, "typed")
    for engine, ip in ((node0, "10.0.0.11"), (node2, "10.0.0.13")):
        # the tutorial's environment, and VLLM_HOST_IP (deviation vllm_host_ip)
        assert engine["env"] == dict(TUTORIAL_ENV, HCCL_IF_IP=ip, VLLM_HOST_IP=ip)


# The vLLM-Ascend Kimi-K3 page (releases/v0.23.0), section 5.2.1, 8 x Atlas 800 A2, with its variables filled in by
# hand for node01 (node 0) and node06 (DP_START_RANK=5): MODEL_PATH=/data/models/k3, LOCAL_IP=10.0.0.1x,
# NODE0_IP=10.0.0.11, NIC_NAME=enp189s0f0, PORT=8000, RPC_PORT=13389 (the tier's; the page leaves both to the
# operator).
A2_ADDITIONAL_CONFIG = ("'{\"enable_flashcomm1\":false,\"ascend_compilation_config\":{\"enable_npugraph_ex\":true,"
                        "\"enable_static_kernel\":false},\"enable_cpu_binding\":true}'")
A2_NODE0 = """vllm serve /data/models/k3 \\
    --host 0.0.0.0 \\
    --port 8000 \\
    --served-model-name kimi-k3 \\
    --trust-remote-code \\
    --language-model-only \\
    --mm-encoder-tp-mode data \\
    --skip-mm-profiling \\
    --limit-mm-per-prompt '{"vision_chunk":2}' \\
    --data-parallel-size 8 \\
    --data-parallel-size-local 1 \\
    --data-parallel-start-rank 0 \\
    --data-parallel-address 10.0.0.11 \\
    --data-parallel-rpc-port 13389 \\
    --tensor-parallel-size 8 \\
    --enable-expert-parallel \\
    --dtype bfloat16 \\
    --max-model-len 262144 \\
    --gpu-memory-utilization 0.90 \\
    --enable-prefix-caching \\
    --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[1,2,4,8]}' \\
    --tokenizer-mode kimi_k3 \\
    --enable-auto-tool-choice \\
    --reasoning-parser kimi_k3 \\
    --tool-call-parser kimi_k3 \\
    --additional-config """ + A2_ADDITIONAL_CONFIG
A2_NODE5 = A2_NODE0.replace("vllm serve /data/models/k3 \\\n", "vllm serve /data/models/k3 \\\n    --headless \\\n").replace(
    "--data-parallel-start-rank 0", "--data-parallel-start-rank 5")
A2_ENV = {
    "PYTHONPATH": "/vllm-workspace/vllm-ascend", "GLOO_SOCKET_IFNAME": "enp189s0f0",
    "TP_SOCKET_IFNAME": "enp189s0f0", "HCCL_SOCKET_IFNAME": "enp189s0f0", "HCCL_CONNECT_TIMEOUT": "1800",
    "HCCL_EXEC_TIMEOUT": "1800", "HCCL_BUFFSIZE": "256", "HCCL_INTRA_ROCE_ENABLE": "1",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "30000", "OMP_PROC_BIND": "false", "OMP_NUM_THREADS": "10",
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "VLLM_LOGGING_LEVEL": "INFO", "TASK_QUEUE_ENABLE": "1",
    "TIKTOKEN_CACHE_DIR": "/root/.cache/tiktoken-k3", "ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}
A2_SETUP = ["/bin/bash", "-c", "source /usr/local/Ascend/ascend-toolkit/set_env.sh && source /vllm-workspace/vllm-ascend/"
            "vllm_ascend/_cann_ops_custom/vendors/custom_transformer/bin/set_env.bash && exec \"$@\"",
            "npuops-recipe-setup"]


def test_the_a2_pages_node0_and_worker_commands_run_after_its_setup_lines():
    out = plan_containers("8node_a2_dp", "kimi_k3_w4a8")
    assert sorted(out) == ["node%02d" % i for i in range(1, 9)]
    node0, node5 = out["node01"]["engine"], out["node06"]["engine"]
    for engine, want, ip in ((node0, A2_NODE0, "10.0.0.11"), (node5, A2_NODE5, "10.0.0.16")):
        assert engine["command"][:4] == A2_SETUP  # the page's two `source` lines, then the command as it is
        want = recipes.command_spec(want, "typed")
        if engine is node0:
            want["host"] = "10.0.0.11"  # deviation listen_on_the_node_address, the only one on the command
        assert spec_of(engine["command"][4:]) == want
        # the page's environment; PYTHONPATH without the shell expansion (deviation a2_pythonpath)
        assert engine["env"] == dict(A2_ENV, HCCL_IF_IP=ip, VLLM_HOST_IP=ip)
        assert engine["devices"][:8] == ["/dev/davinci%d" % d for d in range(8)] and "/dev/davinci8" not in \
            engine["devices"]
    assert out["node04"]["engine"]["command"][4:][out["node04"]["engine"]["command"][4:].index(
        "--data-parallel-start-rank") + 1] == "3"


# The same page, the note after section 5.1.1 (1M-token context on eight A3 nodes): the four-node commands (lines
# 168-212 and 220-267) with --data-parallel-size 8, --max-model-len 1048576 and --max-num-batched-tokens 8192, nodes 1
# through 7 with --data-parallel-start-rank 1 through 7; filled in by hand for node01 and node08 (MODEL_PATH=
# /data/models/k3, LOCAL_IP=10.0.0.1x, NODE0_IP=10.0.0.11, PORT=8000, RPC_PORT=13389).
PAGE_1M_NODE0 = """vllm serve /data/models/k3 \\
    --served-model-name kimi-k3 \\
    --port 8000 \\
    --allowed-local-media-path / \\
    --trust-remote-code \\
    --tensor-parallel-size 16 \\
    --data-parallel-size 8 \\
    --data-parallel-size-local 1 \\
    --data-parallel-address 10.0.0.11 \\
    --data-parallel-rpc-port 13389 \\
    --enable-prefix-caching \\
    --enable-expert-parallel \\
    --max-num-seqs 16 \\
    --max-model-len 1048576 \\
    --max-num-batched-tokens 8192 \\
    --gpu-memory-utilization 0.9 \\
    --compilation-config '{"cudagraph_mode":"FULL_DECODE_ONLY"}' \\
    --mm-processor-cache-gb 0 \\
    --additional-config '{"enable_cpu_binding":true, "enable_flashcomm1":true}' \\
    --mm-encoder-tp-mode data \\
    --limit-mm-per-prompt '{"vision_chunk": 2}' \\
    --enable-auto-tool-choice \\
    --reasoning-parser kimi_k3 \\
    --tool-call-parser kimi_k3"""
PAGE_1M_NODE7 = PAGE_1M_NODE0.replace("vllm serve /data/models/k3 \\\n", "vllm serve /data/models/k3 \\\n    --headless \\\n").replace(
    "    --data-parallel-size-local 1 \\\n", "    --data-parallel-size-local 1 \\\n    --data-parallel-start-rank 7 \\\n")


def test_the_pages_1m_context_commands_are_its_four_node_ones_with_the_three_values_of_its_note():
    out = plan_containers("8node_dp", "kimi_k3_w4a8")
    assert sorted(out) == ["node%02d" % i for i in range(1, 9)]
    node0, node7 = out["node01"]["engine"], out["node08"]["engine"]
    want0 = recipes.command_spec(PAGE_1M_NODE0, "typed")
    want0["host"] = "10.0.0.11"  # deviation listen_on_the_node_address, the only one on the command
    assert node0["recipe"] == "vllm_ascend_kimi_k3_8node_a3_1m"
    assert spec_of(node0["command"]) == want0
    assert spec_of(node7["command"]) == recipes.command_spec(PAGE_1M_NODE7, "typed")
    assert node7["env"]["HCCL_BUFFSIZE"] == "800" and "VLLM_ENGINE_READY_TIMEOUT_S" not in node7["env"]
    assert node0["env"]["VLLM_ENGINE_READY_TIMEOUT_S"] == "7200"


def test_a_derived_recipe_whose_base_lacks_a_changed_flag_is_refused():
    base = {"name": "b", "roles": {"leader": {"command": "vllm serve /m \\\n  --max-model-len 4096"}}}
    derived = {"name": "d", "base": "vllm_ascend_kimi_k3_4node_a3", "changes": {"--max-model-len": 8192}}
    assert recipes.resolve(derived, lambda name: base)["roles"]["leader"]["command"] == \
        "vllm serve /m \\\n  --max-model-len 8192"
    with pytest.raises(recipes.RecipeError, match="recipe d, role leader: --max-num-seqs appears 0 times"):
        recipes.resolve(dict(derived, changes={"--max-num-seqs": 8}), lambda name: base)
    with pytest.raises(recipes.RecipeError, match="base 'nope' is not one of"):
        recipes.resolve(dict(derived, base="nope"), lambda name: base)


@pytest.mark.parametrize("name", recipes.names())
def test_every_recipe_runs_as_published_but_the_rows_of_the_deviations_table(name):
    recipe = recipes.load(name)
    out = plan_containers(recipe["tier"], recipe["models"][0], name)
    rows = dict((r["id"], r) for r in recipes.deviations())
    seen = set()
    for host, pair in out.items():
        engine = pair["engine"]
        assert engine["recipe"] == name
        for diff in engine["recipe_diff"]:
            assert diff["why"] and diff["why"].startswith("deviation "), (host, diff)
            row = rows[diff["why"].split(", ")[0].split(" ", 1)[1]]
            if diff["kind"] == "container":
                assert diff["key"].split(" ")[0] in {"shm_size": "--shm-size", "privileged": "--privileged",
                                                     "mounts": "mount"}[row["container"]]
                continue
            assert diff["key"] == (row.get("env") or recipes.vllm_cli.FLAGS.get(row["flag"], (row["flag"],))[0])
            seen.add(diff["why"])
    assert "deviation listen_on_the_node_address" in seen or name == "gpuworks_kimi_k3_1_pro_2node_a3"


def test_the_deviations_table_gives_every_row_a_reason_and_a_source():
    ids = [r["id"] for r in recipes.deviations()]
    assert len(ids) == len(set(ids))
    for row in recipes.deviations():
        assert row.get("reason") and row.get("source"), row["id"]
        assert sum(k in row for k in ("flag", "env", "container")) == 1, row["id"]
        # a flag or env row changes something; a container row explains a serve option's difference
        assert sum(k in row for k in ("value", "remove", "merge")) == (0 if "container" in row else 1), row["id"]


def test_an_operator_override_is_named_in_the_difference():
    out = plan_containers("4node_dp", "kimi_k3_w4a8", overrides={"max_num_seqs": 32})
    rows = [r for r in out["node02"]["engine"]["recipe_diff"] if r["key"] == "--max-num-seqs"]
    assert rows == [{"kind": "flag", "key": "--max-num-seqs", "recipe": "16", "runs": "32",
                     "why": "npuops_model_overrides.max_num_seqs"}]
    lines = serve.recipe_diff_lines(out)
    assert "  --max-num-seqs: 16 -> 32 (npuops_model_overrides.max_num_seqs)" in lines


def test_the_field_reports_template_with_what_its_platform_filled_in():
    out = plan_containers("2node_pp", "kimi_k3_1_pro_w4a8")
    lead, follower = (spec_of(out[h]["engine"]["command"]) for h in ("node01", "node02"))
    # the template's key flags (GPUWorks field report), verbatim
    for spec in (lead, follower):
        for key, value in (("quantization", "ascend"), ("trust_remote_code", True), ("tensor_parallel_size", 16),
                           ("pipeline_parallel_size", 2), ("max_model_len", 210000), ("max_num_seqs", 64),
                           ("max_num_batched_tokens", 8192), ("kv_cache_dtype", "int8"), ("block_size", 768),
                           ("gpu_memory_utilization", 0.90), ("enable_prefix_caching", True),
                           ("enable_expert_parallel", True), ("tokenizer_mode", "kimi_k3"),
                           ("reasoning_parser", "kimi_k3"), ("tool_call_parser", "kimi_k3"),
                           ("enable_auto_tool_choice", True), ("nnodes", 2), ("master_addr", "10.0.0.11")):
            assert spec[key] == value, key
    assert (lead["node_rank"], follower["node_rank"], follower.get("headless"), lead.get("headless")) == (0, 1, True, None)
    assert lead["model"] == "/data/models/k3" and lead["served_model_name"] == "kimi-k3.1-pro"


def test_a_recipe_for_another_tier_or_none_at_all_says_what_to_do():
    with pytest.raises(recipes.RecipeError, match="is a recipe for tier 4node_dp, the inventory's tier is 2node_pp"):
        recipes.choose("kimi_k3_tutorial_4node_a3", "2node_pp", "kimi_k3_w4a8")
    with pytest.raises(recipes.RecipeError, match="recipe 'nope' is not one of"):
        recipes.choose("nope", "2node_pp", "kimi_k3_w4a8")
    with pytest.raises(recipes.RecipeError, match="no recipe is the default for tier 4node_dp with model preset x"):
        recipes.choose(None, "4node_dp", "x")


def test_a_command_is_read_as_vllm_reads_it():
    spec = recipes.command_spec("vllm serve /m --safetensors_load_strategy prefetch --no-enable-prefix-caching "
                                "--max-num-seqs=8 --limit-mm-per-prompt '{\"vision_chunk\": 2}'", "t")
    assert spec == {"model": "/m", "safetensors_load_strategy": "prefetch", "enable_prefix_caching": False,
                    "max_num_seqs": 8, "limit_mm_per_prompt": {"vision_chunk": 2}}
    with pytest.raises(recipes.RecipeError, match="flag --max-num-seq is not in vllm_cli.FLAGS"):
        recipes.command_spec("vllm serve /m --max-num-seq 8", "t")
    with pytest.raises(recipes.RecipeError, match=r"the variable \$RPC_PORT has no value"):
        recipes.bind("--data-parallel-rpc-port $RPC_PORT", {"PORT": 1}, "t")
    assert recipes.bind("a ${x} $1 <Y_Z>", {"x": "1", "1": "2", "Y_Z": "3"}, "t") == "a 1 2 3"


def test_the_container_differs_from_the_recipes_docker_run_only_where_a_row_says_why():
    out = plan_containers("4node_dp", "kimi_k3_w4a8")
    rows = dict((r["key"], r) for r in out["node01"]["engine"]["recipe_diff"] if r["kind"] == "container")
    # the tutorial's docker run: --shm-size=1g, the whole driver directory, the model root
    assert rows["--shm-size"] == {"kind": "container", "key": "--shm-size", "recipe": "1g", "runs": "16g",
                                  "why": "deviation container_shm_size"}
    assert rows["mount /usr/local/Ascend/driver"]["runs"] == "(absent)"
    assert rows["mount /etc/hccn.conf"]["recipe"] == "(absent)"
    assert "mount /data/models/k3" not in rows and "mount /usr/local/dcmi" not in rows
    # the field report publishes no docker run: nothing to compare
    two = plan_containers("2node_pp", "kimi_k3_1_pro_w4a8")
    assert not [r for r in two["node01"]["engine"]["recipe_diff"] if r["kind"] == "container"]


def test_every_recipes_commands_have_the_parallel_sizes_of_the_tier_they_pair_with():
    """TP, PP, DP and DP-local are stated twice - in the tier document and as literals in the commands its recipes
    publish: they must agree, role by role (the leader and workers of a tier's one group; prefill and decode with the
    kv_producer and kv_consumer groups)."""
    checked, wrong = 0, []
    for name in recipes.names():
        recipe = recipes.load(name)
        tier = catalog.load("tiers/" + recipe["tier"])
        for role, entry in (recipe.get("roles") or {}).items():
            kv_role = {"prefill": "kv_producer", "decode": "kv_consumer"}.get(role)
            groups = [g for g in tier["groups"] if g.get("kv_role") == kv_role]
            assert len(groups) == 1, (name, role, [g["name"] for g in tier["groups"]])
            group = groups[0]
            # a size the source gives by a variable is what the plan binds to it (the tier's, when the variable names
            # the right field); the operator's other values (addresses, ports, ranks) are placeholders
            fields = recipe.get("variables") or {}
            command = re.sub(r"\$\{?([A-Za-z0-9_]+)\}?", lambda m: str(group.get(fields.get(m.group(1)), 7))
                             if fields.get(m.group(1)) in ("tp", "pp", "dp", "dp_local") else "7", entry["command"])
            spec = recipes.command_spec(command, "%s %s" % (name, role))
            for flag, key in (("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp"),
                              ("data_parallel_size", "dp"), ("data_parallel_size_local", "dp_local")):
                if key not in group or (flag == "data_parallel_size_local" and flag not in spec):
                    # DP-local unset depends on the launch (a rank per process with --data-parallel-rank): not a literal
                    continue
                said = spec.get(flag, 1)  # vLLM's default size
                checked += 1
                if said != group[key]:
                    wrong.append("%s, role %s: --%s %s but tier %s says %s %s" % (
                        name, role, flag.replace("_", "-"), said, tier["name"], key, group[key]))
    assert checked >= 30 and wrong == [], wrong
