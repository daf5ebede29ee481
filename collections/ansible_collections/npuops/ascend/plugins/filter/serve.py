# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""serve_containers: the plan plus the model preset -> the exact container each host runs.

One function for every tier: the host's part of the plan decides the launch flags (multi-node TP/PP,
internal DP with headless workers, external DP ranks with a KV connector), the preset the model flags,
the inventory the addresses and NICs every communication library is pointed at, and the tier document
the per-role environment. vllm_cli renders and checks the argv.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.filter.topology import DEFAULT_INSTANCE
from ansible_collections.npuops.ascend.plugins.module_utils import vllm_cli
from ansible_collections.npuops.ascend.plugins.plugin_utils import board, values
from ansible_collections.npuops.ascend.plugins.plugin_utils.hostvars import hostvar

PROXY_SCRIPT = "/vllm-workspace/vllm-ascend/examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"
# device nodes and read-only host paths every vLLM-Ascend container needs (vllm-ascend installation.md docker run),
# plus /etc/hccn.conf, which the PD docs require and without which the service answers garbage (vllm-ascend#7711)
MGMT_DEVICES = ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
HOST_MOUNTS = ["/usr/local/dcmi", "/usr/local/Ascend/driver/tools/hccn_tool", "/usr/local/bin/npu-smi",
               "/usr/local/Ascend/driver/lib64", "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info",
               "/etc/hccn.conf"]
# environment every node gets (vllm-ascend multi-node tutorials); the tier adds per-group values, the inventory overrides
COMMON_ENV = {
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "VLLM_ENGINE_READY_TIMEOUT_S": "7200",
    "HCCL_CONNECT_TIMEOUT": "1200",
    "HCCL_OP_EXPANSION_MODE": "AIV",
    "TASK_QUEUE_ENABLE": "1",
    "OMP_PROC_BIND": "false",
    "OMP_NUM_THREADS": "1",
}
MODEL_KEYS = ("served_model_name", "quantization", "tokenizer_mode", "reasoning_parser", "tool_call_parser",
              "max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "block_size",
              "safetensors_load_strategy")


def engine_spec(entry, model, model_dir, tier, group, ports):
    """The vllm serve spec of one host (before per-host overrides)."""
    spec = {"model": model_dir, "trust_remote_code": True, "enable_auto_tool_choice": True}
    for key in MODEL_KEYS:
        if model.get(key) is not None:
            spec[key] = model[key]
    if model.get("kv_cache_dtype") not in (None, "auto"):
        spec["kv_cache_dtype"] = model["kv_cache_dtype"]
    if model.get("cudagraph_mode"):
        spec["compilation_config"] = {"cudagraph_mode": model["cudagraph_mode"]}
    if model.get("speculative"):
        spec["speculative_config"] = dict(model["speculative"])
    # decode engines do not share prefixes (vllm-ascend#7944); elsewhere prefix caching follows the preset
    spec["enable_prefix_caching"] = bool(model.get("enable_prefix_caching", True)) and \
        entry.get("kv_role") != "kv_consumer"
    spec["tensor_parallel_size"] = entry["tp"]
    if entry["pp"] > 1:
        spec["pipeline_parallel_size"] = entry["pp"]
    if entry["serves_http"]:
        spec.update(host=entry["node_ip"], port=entry["api_port"])
    launch = entry["launch"]
    if launch == "multinode":
        spec.update(distributed_executor_backend="mp", nnodes=entry["nodes"], node_rank=entry["node_rank"],
                    master_addr=entry["leader_address"], master_port=int(ports.get("master", 29500)))
    else:
        spec.update(data_parallel_size=entry["dp"], data_parallel_size_local=entry["dp_local"],
                    data_parallel_address=entry["leader_address"],
                    data_parallel_rpc_port=int(ports.get("dp_rpc", 13389)))
        if launch == "dp_external":
            spec["data_parallel_rank"] = entry["dp_start_rank"]
        elif entry["role"] == "worker":
            spec["data_parallel_start_rank"] = entry["dp_start_rank"]
    if entry["expert_parallel"]:
        spec["enable_expert_parallel"] = True
    if entry["headless"]:
        spec["headless"] = True
    if entry.get("kv_role"):
        sides = dict(("prefill" if g.get("kv_role") == "kv_producer" else "decode",
                      {"dp_size": int(g["dp"]), "tp_size": int(g["tp"])}) for g in tier["groups"] if g.get("kv_role"))
        spec["kv_transfer_config"] = {
            "kv_connector": group.get("kv_connector", "MooncakeConnectorV1"),
            "kv_role": entry["kv_role"],
            "kv_port": str(entry["kv_port"]),
            # unique per engine (vLLM defaults to a uuid4 per start; a stable id keeps the spec's hash stable)
            "engine_id": "%s%s-%d" % ("" if entry["instance"] == DEFAULT_INSTANCE else entry["instance"] + "-",
                                      entry["group"], entry["dp_start_rank"]),
            "kv_connector_extra_config": group.get("kv_connector_extra_config") or sides,
        }
    return spec


def engine_env(entry, hostvars, host, tier, group, dies):
    nic = hostvar(hostvars, host, "npuops_nic")
    env = dict(COMMON_ENV)
    env.update(HCCL_IF_IP=entry["node_ip"], VLLM_HOST_IP=entry["node_ip"], GLOO_SOCKET_IFNAME=nic,
               TP_SOCKET_IFNAME=nic, HCCL_SOCKET_IFNAME=nic,
               ASCEND_RT_VISIBLE_DEVICES=",".join(str(i) for i in range(dies)))
    # later layers win: tier, group, group per role, then the host's own overrides
    for layer in (tier.get("env"), group.get("env"), (group.get("env_by_role") or {}).get(entry["role"]),
                  hostvar(hostvars, host, "npuops_env_overrides")):
        env.update((k, str(v)) for k, v in (layer or {}).items())
    return env


def rendezvous_peer(spec):
    """Where this engine dials its leader, read from its own final spec (overrides included)."""
    if (spec.get("nnodes") or 1) > 1:
        return ["%s:%d" % (spec["master_addr"], spec["master_port"])]
    if (spec.get("data_parallel_size") or 1) > 1 and spec.get("data_parallel_address"):
        return ["%s:%d" % (spec["data_parallel_address"], spec["data_parallel_rpc_port"])]
    return []


def labels(entry, tier):
    """What makes a container the service's own: preflight, status and recover read these."""
    return {"io.npuops.tier": tier["name"], "io.npuops.instance": entry["instance"],
            "io.npuops.group": entry.get("group") or "proxy", "io.npuops.role": entry["role"]}


def serve_containers(plan, hostvars, tier, model, options):
    """-> {host: {"engine": container or None, "proxy": container or None}}.

    `options`: model_dir, image, name (engine container), proxy_name, shm_size, privileged, devices (physical
    ids, default 0..dies-1). A container: {name, image, command, env, devices, mounts, shm_size, privileged,
    labels, ready_url, peers, instance, group, group_key, role}.
    """
    dies = int(tier.get("dies_per_node", 16))
    groups = dict((g["name"], g) for g in tier["groups"])
    privileged = values.to_bool(options.get("privileged", False))
    out = {}
    for host, entry in sorted(plan["hosts"].items()):
        group = groups[entry["group"]]
        instance = plan["instances"][entry["instance"]]
        spec = engine_spec(entry, model, options["model_dir"], tier, group, instance["ports"])
        spec.update(hostvar(hostvars, host, "npuops_vllm_overrides", {}) or {})
        try:
            argv = vllm_cli.render(spec)
        except vllm_cli.VllmCliError as e:
            raise AnsibleFilterError("serve_containers: host %s: %s" % (host, e))
        leader = plan["hosts"][entry["leader"]]
        ready_host = entry if entry["serves_http"] else leader
        devices = hostvar(hostvars, host, "npuops_devices") or options.get("devices") or list(range(dies))
        peers = rendezvous_peer(spec) if entry["role"] == "worker" else []
        out[host] = {"engine": {
            "name": options.get("name", "vllm"),
            "image": hostvar(hostvars, host, "npuops_image", options["image"]),
            "command": argv,
            "env": engine_env(entry, hostvars, host, tier, group, dies),
            "devices": ["/dev/davinci%d" % int(d) for d in devices] + MGMT_DEVICES,
            "mounts": ["%s:%s:ro" % (m, m) for m in HOST_MOUNTS + [options["model_dir"]]],
            "shm_size": options.get("shm_size", "16g"),
            "privileged": privileged,
            "labels": labels(entry, tier),
            "ready_url": "http://%s:%d/health" % (ready_host["node_ip"], ready_host["api_port"]),
            "peers": peers,
            "instance": entry["instance"],
            "group": entry["group"],
            "group_key": entry["group_key"],
            "role": entry["role"],
        }, "proxy": None}
    for name, instance in sorted(plan["instances"].items()):
        proxy = instance.get("proxy")
        if not proxy:
            continue
        argv = ["python3", PROXY_SCRIPT, "--host", proxy["address"], "--port", str(proxy["port"])]
        for side, flag in (("prefill", "prefiller"), ("decode", "decoder")):
            argv += ["--%s-hosts" % flag] + [e["address"] for e in proxy[side]]
            argv += ["--%s-ports" % flag] + [str(e["port"]) for e in proxy[side]]
        entry = {"instance": name, "group": None, "role": "proxy"}
        out.setdefault(proxy["host"], {"engine": None, "proxy": None})["proxy"] = {
            "name": options.get("proxy_name", "vllm-pd-proxy"),
            "image": hostvar(hostvars, instance["hosts"][0], "npuops_image", options["image"]),
            "command": argv,
            "env": {"PYTHONUNBUFFERED": "1"},
            "devices": [],
            "mounts": [],
            "shm_size": None,
            "privileged": False,
            "labels": labels(entry, tier),
            "ready_url": "http://%s:%d%s" % (proxy["address"], proxy["port"], proxy["health"]),
            "peers": [],
            "instance": name,
            "group": None,
            "group_key": "%s/proxy" % name,
            "role": "proxy",
        }
    return out


def serve_restarts(hostvars, plan, key, force=(), active=None):
    """From every engine's preview (vllm_container in check mode, registered under `key`): which engine groups
    restart, the lines that say why, which serving instances that interrupts, and the hosts that could not be
    asked. A group restarts as a whole when any of its engines would change, start or be created, or when it is
    forced (recover)."""
    restart = set(force or [])
    problems, lines = [], []
    results = {}
    for host, entry in sorted(plan["hosts"].items()):
        res = hostvar(hostvars, host, key, {}) or {}
        results[host] = res
        if active is not None and host not in active:
            problems.append("%s: not in the play any more (unreachable or failed before this stage)" % host)
        elif res.get("unreachable"):
            problems.append("%s: unreachable (%s)" % (host, (res.get("msg") or "no answer")[:300]))
        elif res.get("failed"):
            problems.append("%s: %s" % (host, res.get("msg")))
        action = res.get("action") or "none"
        if action != "none":
            restart.add(entry["group_key"])
            lines.append("%s (%s): %s" % (host, action, "; ".join(res.get("changes") or []) or action))
    for host, entry in sorted(plan["hosts"].items()):
        if entry["group_key"] in restart and (results[host].get("action") or "none") == "none":
            lines.append("%s (restart with its group %s)" % (host, entry["group_key"]))
    serving = set()
    for name, inst in plan["instances"].items():
        for group in inst["groups"].values():
            if group["key"] in restart and all(results[h].get("started_at") for h in group["hosts"]):
                serving.add(name)
    restart_hosts = sorted(h for h, e in plan["hosts"].items() if e["group_key"] in restart)
    # with a gateway in front of two or more instances, serving instances restart one at a time, each drained
    # at the gateway first: the others take the requests meanwhile
    rolling = bool(serving) and bool(plan.get("gateway")) and len(plan["instances"]) > 1
    return {"restart": sorted(restart), "restart_hosts": restart_hosts, "lines": lines, "problems": problems,
            "interrupts": sorted(serving), "rolling": rolling,
            "interrupts_service": bool(serving) and not rolling and not (set(plan["instances"]) - serving)}


SHOWN = ("name", "image", "command", "env", "devices", "mounts", "shm_size", "privileged", "labels")


def _shown(c):
    out = dict((k, c[k]) for k in SHOWN)
    out["argv"] = out.pop("command")
    return out


def plan_report(containers, plan):
    """plan.yml's output: per host its role, ranks and every field of the container it gets (the dry run is the
    deployment), per instance its proxy and endpoint, and the service's endpoint."""
    hosts = {}
    for host, entry in sorted(plan["hosts"].items()):
        hosts[host] = {"role": entry["role"], "instance": entry["instance"], "group": entry["group"],
                       "rank": entry["dp_start_rank"] if entry["launch"] != "multinode" else entry["node_rank"],
                       "headless": entry["headless"], "container": _shown(containers[host]["engine"])}
    instances = {}
    for name, inst in sorted(plan["instances"].items()):
        proxy = None
        if inst.get("proxy"):
            proxy = {"host": inst["proxy"]["host"], "container": _shown(containers[inst["proxy"]["host"]]["proxy"])}
        instances[name] = {"hosts": inst["hosts"], "endpoint": inst["endpoint"], "proxy": proxy}
    return {"tier": plan["tier"], "endpoint": plan["endpoint"], "hosts": hosts, "instances": instances,
            "gateway": plan.get("gateway")}


def serve_leftovers(last, plan):
    """'host: ...' lines for the hosts of the last deployment (its record: {hosts: {host: instance}}) that the plan no
    longer has: their engine containers (running or exited) and NPU exporters are still there, and nothing of this
    run reaches them."""
    gone = sorted(h for h in ((last or {}).get("hosts") or {}) if h not in plan["hosts"])
    return ["%s ran an engine of instance %s in the last deployment and is no longer in the inventory: its container "
            "and NPU exporter are still there; stop them (playbooks/stop.yml with an inventory that has it, or by "
            "hand)" % (h, last["hosts"][h]) for h in gone]


def deployment_record(plan):
    """What the next run compares its plan with: every engine host and its instance."""
    return {"tier": plan["tier"], "hosts": dict((h, e["instance"]) for h, e in sorted(plan["hosts"].items()))}


def board_dirs(run_id, phases=("settle", "ready")):
    """The controller-side status boards of one deploy run (to remove them when it ends)."""
    return [board.board_dir("%s-%s" % (run_id, phase)) for phase in phases]


class FilterModule(object):
    def filters(self):
        return {"serve_containers": serve_containers, "serve_restarts": serve_restarts, "plan_report": plan_report,
                "board_dirs": board_dirs, "serve_leftovers": serve_leftovers,
                "serve_deployment_record": deployment_record}
