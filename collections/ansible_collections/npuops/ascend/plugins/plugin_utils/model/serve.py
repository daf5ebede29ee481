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

import copy
import hashlib
import re

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.plugin_utils.model.topology import DEFAULT_INSTANCE, instance_model
from ansible_collections.npuops.ascend.plugins.module_utils import container, manifest, verdict, vllm_cli
from ansible_collections.npuops.ascend.plugins.plugin_utils import board, recipes, speculative, values, versions
from ansible_collections.npuops.ascend.plugins.plugin_utils.model.hostvars import hostvar, setting

# the Kimi-K3 page, section 5.1.2.1: "python -c \"from memcache_hybrid import MetaService; MetaService.main()\""
KV_POOL_COMMAND = ["python", "-c", "from memcache_hybrid import MetaService; MetaService.main()"]
PROXY_SCRIPT = "/vllm-workspace/vllm-ascend/examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"
# device nodes and read-only host paths every vLLM-Ascend container needs (vllm-ascend installation.md docker run).
# The host paths mounted only where they exist follow them: npuops_serve_optional_mounts, by default /etc/hccn.conf,
# which the PD docs require and without which the service answers garbage (vllm-ascend#7711)
MGMT_DEVICES = ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
HOST_MOUNTS = ["/usr/local/dcmi", "/usr/local/Ascend/driver/tools/hccn_tool", "/usr/local/bin/npu-smi",
               "/usr/local/Ascend/driver/lib64", "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info"]
# preset fields that are vLLM flags under another name (npuops_model_overrides reaches the command through them)
PRESET_FLAGS = {"cudagraph_mode": ("compilation_config", "cudagraph_mode"), "speculative": ("speculative_config", None)}


class RenderError(Exception):
    pass


def host_mounts(optional):
    """The host paths an engine container mounts read-only: every one it needs, then the `optional` ones (the
    serve stage leaves out those a node does not have)."""
    return HOST_MOUNTS + [m for m in optional if m not in HOST_MOUNTS]


def pd_sizes(instance):
    """{prefill_tp, prefill_dp, decode_tp, decode_dp} of a prefill/decode instance (what kv_connector_extra_config
    says of both sides), None values otherwise."""
    out = dict.fromkeys(("prefill_tp", "prefill_dp", "decode_tp", "decode_dp"))
    for g in instance["groups"].values():
        side = {"kv_producer": "prefill", "kv_consumer": "decode"}.get(g.get("kv_role"))
        if side:
            out.update({side + "_tp": g["tp"], side + "_dp": g["dp"]})
    return out


def kv_pool_files(pool):
    """{"meta": text of mmc-meta.conf, "local": text of mmc-local.conf} of an instance's memcache KV pool: the keys of
    vllm-ascend's kv_pool.md ("Configuring the memcache Config File", releases/v0.23.0), the MetaService's URLs from
    the plan (both sides name the same MetaService and config store)."""
    tls = "true" if pool.get("tls") else "false"
    # TLS written out on both sides: absent it is on (MemCache doc/memcache_config.md), and the files must agree
    both = ["ock.mmc.tls.enable = %s" % tls, "ock.mmc.config_store.tls.enable = %s" % tls]
    meta = ["ock.mmc.meta_service_url = %s" % pool["meta_service_url"],
            "ock.mmc.meta_service.config_store_url = %s" % pool["config_store_url"],
            "ock.mmc.meta_service.metrics_url = %s" % pool["metrics_url"],
            "ock.mmc.log_level = %s" % pool["log_level"]] + both
    local = ["ock.mmc.meta_service_url = %s" % pool["meta_service_url"],
             "ock.mmc.local_service.config_store_url = %s" % pool["config_store_url"],
             "ock.mmc.log_level = %s" % pool["log_level"],
             "ock.mmc.local_service.world_size = %s" % pool["world_size"],
             "ock.mmc.local_service.protocol = %s" % pool["protocol"],
             "ock.mmc.local_service.dram.size = %s" % pool["dram_size"]] + both
    return {"meta": "\n".join(meta) + "\n", "local": "\n".join(local) + "\n"}


def digest(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def plan_values(entry, ports, hostvars, host, model, options, dies, pd=None, pool=None):
    """The plan's values a recipe's variables and the deviation rows name (docs/recipes.md lists them)."""
    engine_id = None
    if entry.get("kv_role"):
        # unique per engine (vLLM defaults to a uuid4 per start; a stable id keeps the spec's hash stable)
        engine_id = "%s%s-%d" % ("" if entry["instance"] == DEFAULT_INSTANCE else entry["instance"] + "-",
                                 entry["group"], entry["dp_start_rank"])
    return {
        "model_dir": options["model_dir"],
        "tokenizer_dir": options.get("tokenizer_dir") or options["model_dir"],
        "served_model_name": model.get("served_model_name"),
        "node_ip": entry["node_ip"], "leader_address": entry["leader_address"],
        "nic": hostvar(hostvars, host, "npuops_nic"),
        "api_port": int(ports.get("api", 8000)), "dp_rpc_port": int(ports.get("dp_rpc", 13389)),
        "master_port": int(ports.get("master", 29500)),
        "tp": entry["tp"], "pp": entry["pp"], "dp": entry["dp"], "dp_local": entry["dp_local"],
        "dp_start_rank": entry["dp_start_rank"], "node_rank": entry["node_rank"], "nodes": entry["nodes"],
        "kv_port": entry.get("kv_port"), "engine_id": engine_id,
        "service_model_name": options.get("service_model_name") or model.get("served_model_name"),
        "visible_devices": ",".join(str(i) for i in range(dies)),
        "mmc_local_conf": pool["local_conf"] if pool else None,
        # the image's vLLM-Ascend line (data/images.yml), the draft's directory, and whether the instance's KV moves
        # through fabric memory (preflight's finding, or the inventory's npuops_fabric_mem)
        "line": ((options.get("recipe") or {}).get("selection") or {}).get("line"),
        "draft_dir": (model.get("draft") or {}).get("dir"),
        "fabric_mem": entry["instance"] not in (options.get("fabric_mem_off") or [])
        and values.to_bool(setting(hostvars, host, "npuops_fabric_mem")),
        **(pd or {})
    }


def engine_command(entry, recipe, values, model, overrides, vllm_overrides, env_overrides, rows):
    """-> (spec, env, recipe_spec, recipe_env, reasons): the recipe's role bound to the plan's values, the deviation
    rows that apply, then the operator's overrides (npuops_model_overrides, npuops_vllm_overrides,
    npuops_env_overrides), each difference with where it comes from."""
    role = recipes.role_of(entry)
    recipe_spec, recipe_env = recipes.render(recipe, role, values)
    spec, env = copy.deepcopy(recipe_spec), dict(recipe_env)
    reasons = {}

    def deviate(late):
        for row in recipes.apply_deviations(recipe, role, entry, values, spec, env, rows, late):
            where = ("flag", row["flag"]) if "flag" in row else ("env", row["env"])
            # rows that change one JSON flag in turn are all named
            reasons[where] = (reasons[where] + ", " if where in reasons else "") + "deviation " + row["id"]

    deviate(False)
    draft = model.get("draft")
    if draft:
        # the Kimi-K3 tutorial's section 5.2: the same speculative config on node 0 and the headless workers
        spec["speculative_config"] = speculative.config(draft, values["tp"], entry.get("kv_role"))
        reasons[("flag", "speculative_config")] = "npuops_draft %s (the Kimi-K3 tutorial, section 5.2)" % draft["name"]
    for key in sorted(overrides or {}):
        if key in vllm_cli.FLAGS and model.get(key) is not None:
            if key == "kv_cache_dtype" and model[key] == "auto":
                spec.pop(key, None)
            else:
                spec[key] = model[key]
            reasons[("flag", key)] = "npuops_model_overrides.%s" % key
        elif key in PRESET_FLAGS:
            flag, field = PRESET_FLAGS[key]
            if field:
                spec[flag] = dict(spec.get(flag) or {}, **{field: model[key]})
            else:
                spec[flag] = dict(model[key]) if model.get(key) else None
            reasons[("flag", flag)] = "npuops_model_overrides.%s" % key
    for key, value in (vllm_overrides or {}).items():
        spec[key] = value
        reasons[("flag", key)] = "npuops_vllm_overrides.%s" % key
    for key, value in (env_overrides or {}).items():
        env[key] = str(value)
        reasons[("env", key)] = "npuops_env_overrides.%s" % key
    deviate(True)
    left = sorted("%s=%s" % (k, v) for k, v in env.items() if recipes.unbound(v))
    if left:
        raise RenderError("recipe %s, role %s: %s: no plan value binds these variables and no deviation row "
                          "removes them" % (recipe["name"], role, ", ".join(left)))
    return spec, env, recipe_spec, recipe_env, reasons


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


def instance_options(options, model, instance):
    """(options, model spec) of one instance: what it serves (options["instances"], instance_specs: its recipe,
    model spec and overrides, model and tokenizer directories, image) over the cluster-wide ones."""
    serves = (options.get("instances") or {}).get(instance)
    if not serves:
        return dict(options), model
    out = dict(options)
    out.update((k, serves[k]) for k in ("recipe", "model_overrides", "model_dir", "tokenizer_dir", "image") if k in serves)
    return out, serves.get("model_spec") or model


def serve_containers(plan, hostvars, tier, model, options):
    """-> {host: {"engine": container or None, "proxy": container or None}}.

    `options`: recipe (the recipe document, data/recipes), model_overrides (npuops_model_overrides), model_dir,
    tokenizer_dir, image, name (engine container), proxy_name, shm_size, privileged, devices (physical ids, default
    0..dies-1), instances (instance_specs: what each instance serves, over the others). A container: {name,
    image, command, env, devices, mounts, shm_size, privileged, labels, ready_url, peers, instance, group, group_key,
    role, recipe, recipe_diff}.
    """
    dies = int(tier.get("dies_per_node", 16))
    privileged = values.to_bool(options.get("privileged", False))
    rows = recipes.deviations()  # read once for every host
    gateway = plan.get("gateway") or {}
    # a gateway that mixes the instances sends them requests for the service's name (the first instance's)
    mixing = bool(gateway) and gateway.get("mode") != "tenant"
    service_model = plan.get("served_model_name")
    out = {}
    for host, entry in sorted(plan["hosts"].items()):
        instance = plan["instances"][entry["instance"]]
        iopts, imodel = instance_options(options, model, entry["instance"])
        iopts["service_model_name"] = service_model if mixing else None
        recipe = iopts["recipe"]
        # the weights stage copies the tokenizer directory when it lies outside the model directory: mounted as well
        weight_dirs = [path for _part, path in manifest.directories(
            iopts["model_dir"], iopts.get("tokenizer_dir") or iopts["model_dir"])]
        if imodel.get("draft"):
            weight_dirs.append(imodel["draft"]["dir"].rstrip("/"))
        pool = instance.get("kv_pool")
        plan_vals = plan_values(entry, instance["ports"], hostvars, host, imodel, iopts, dies, pd_sizes(instance), pool)
        alias = mixing and bool(service_model) and service_model != imodel.get("served_model_name")
        try:
            spec, env, recipe_spec, recipe_env, reasons = engine_command(
                dict(entry, service_alias=alias), recipe, plan_vals, imodel, iopts.get("model_overrides"),
                setting(hostvars, host, "npuops_vllm_overrides"), hostvar(hostvars, host, "npuops_env_overrides"),
                rows)
            argv = recipes.setup_argv(recipe, recipes.role_of(entry)) + vllm_cli.render(spec)
        except (vllm_cli.VllmCliError, recipes.RecipeError, RenderError) as e:
            raise AnsibleFilterError("serve_containers: host %s: %s" % (host, e))
        leader = plan["hosts"][entry["leader"]]
        ready_host = entry if entry["serves_http"] else leader
        devices = hostvar(hostvars, host, "npuops_devices") or options.get("devices") or list(range(dies))
        peers = rendezvous_peer(spec) if entry["role"] == "worker" else []
        out[host] = {"engine": {
            "name": options.get("name", "vllm"),
            "image": hostvar(hostvars, host, "npuops_image", iopts["image"]),
            "command": argv,
            "env": env,
            "devices": ["/dev/davinci%d" % int(d) for d in devices] + MGMT_DEVICES,
            "mounts": ["%s:%s:ro" % (m, m) for m in host_mounts(setting(hostvars, host, "npuops_serve_optional_mounts"))
                       + weight_dirs],
            "shm_size": options.get("shm_size", "16g"),
            "privileged": privileged,
            "labels": labels(entry, tier),
            "ready_url": "http://%s:%d/health" % (ready_host["node_ip"], ready_host["api_port"]),
            "peers": peers,
            "instance": entry["instance"],
            "group": entry["group"],
            "group_key": entry["group_key"],
            "role": entry["role"],
            "recipe": recipe["name"],
            # what the command needs from the image's vLLM / vllm-ascend (filter image_problems checks it)
            "needs": dict((k, spec[k]) for k in ("reasoning_parser", "tool_call_parser", "tokenizer_mode",
                                                 "kv_cache_dtype") if spec.get(k) not in (None, "")),
            "recipe_diff": recipes.compare(recipe_spec, recipe_env, spec, env, reasons),
        }, "proxy": None}
        engine = out[host]["engine"]
        engine["recipe_diff"] += recipes.container_diff(recipe, engine, weight_dirs, rows)
        engine["files"] = []
        if pool and env.get("MMC_LOCAL_CONFIG_PATH"):
            # the prefill engines of a pool read mmc-local.conf (MMC_LOCAL_CONFIG_PATH); npuops writes it on the host
            text = kv_pool_files(pool)["local"]
            engine["files"] = [{"path": pool["local_conf"], "content": text}]
            engine["mounts"].append("%s:%s:ro" % (pool["local_conf"], pool["local_conf"]))
            engine["labels"]["io.npuops.kv-pool-config"] = digest(text)

    def image_of(name):
        return instance_options(options, model, name)[0]["image"]

    for name, instance in sorted(plan["instances"].items()):
        pool = instance.get("kv_pool")
        if pool:
            text = kv_pool_files(pool)["meta"]
            entry = {"instance": name, "group": "kv_pool", "role": "kv_pool"}
            out.setdefault(pool["host"], {"engine": None, "proxy": None})["kv_pool"] = {
                "name": options.get("kv_pool_name", "vllm-kv-pool-meta"),
                "image": hostvar(hostvars, instance["hosts"][0], "npuops_image", image_of(name)),
                "command": list(KV_POOL_COMMAND),
                "env": {"MMC_META_CONFIG_PATH": pool["meta_conf"], "PYTHONUNBUFFERED": "1"},
                "devices": [], "mounts": ["%s:%s:ro" % (pool["meta_conf"], pool["meta_conf"])],
                "shm_size": None, "privileged": False,
                "labels": dict(labels(entry, tier), **{"io.npuops.kv-pool-config": digest(text)}),
                "files": [{"path": pool["meta_conf"], "content": text}],
                "address": pool["address"], "port": int(pool["meta_port"]),
                "meta_service_url": pool["meta_service_url"],
                "instance": name, "group": "kv_pool", "group_key": "%s/kv_pool" % name, "role": "kv_pool",
            }
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
            "image": hostvar(hostvars, instance["hosts"][0], "npuops_image", image_of(name)),
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
    for host in out:
        out[host].setdefault("kv_pool", None)
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


def plan_report(containers, plan, specs=None):
    """plan.yml's output: per host its role, ranks and every field of the container it gets (the dry run is the
    deployment), per instance its proxy, endpoint and recipe choice (recipe_choices of `specs`, filter
    instance_specs), and the service's endpoint."""
    choices = recipe_choices(specs)
    hosts = {}
    for host, entry in sorted(plan["hosts"].items()):
        engine = containers[host]["engine"]
        hosts[host] = {"role": entry["role"], "instance": entry["instance"], "group": entry["group"],
                       "rank": entry["dp_start_rank"] if entry["launch"] != "multinode" else entry["node_rank"],
                       "headless": entry["headless"], "container": _shown(engine),
                       "recipe": engine["recipe"], "recipe_diff": engine["recipe_diff"]}
    instances = {}
    for name, inst in sorted(plan["instances"].items()):
        proxy = None
        if inst.get("proxy"):
            proxy = {"host": inst["proxy"]["host"], "container": _shown(containers[inst["proxy"]["host"]]["proxy"])}
        pool = None
        if inst.get("kv_pool"):
            pool = {"host": inst["kv_pool"]["host"],
                    "container": _shown(containers[inst["kv_pool"]["host"]]["kv_pool"])}
        instances[name] = {"hosts": inst["hosts"], "endpoint": inst["endpoint"], "proxy": proxy, "kv_pool": pool,
                           "shape": inst.get("shape"), "model": instance_model(inst), "recipe": choices.get(name)}
    return {"tier": plan["tier"], "endpoint": plan["endpoint"], "hosts": hosts, "instances": instances,
            "gateway": plan.get("gateway")}


def recipe_choices(specs):
    """Per instance (instance_specs' answer), the recipe it follows and why: its source, the vLLM-Ascend line of
    its image it was chosen for (and when the image is newer than every recipe), what upstream has since published in
    its place, and an image whose tag names another hardware generation than the tier's. -> {instance: {recipe,
    source, lines, line, note, superseded, warnings}}."""
    out = {}
    for name, spec in sorted((specs or {}).items()):
        recipe, tier = spec["recipe"], spec.get("tier") or {}
        selection = recipe.get("selection") or {}
        tag = versions.image_tag(spec.get("image")) or ""
        warnings = []
        # vllm-ascend's image workflow (.github/workflows/schedule_image_build_and_push.yaml): -a3[-openeuler] are the
        # A3 builds (Dockerfile.a3*), no suffix or -openeuler the A2 (910B) ones
        if tier.get("generation") == "A3" and tag and not re.search(r"(^|-)a3(-|$)", tag):
            warnings.append("npuops_image %s: by vllm-ascend's image naming a tag without -a3 is an A2 (910B) build "
                            "(-a3 and -a3-openeuler are the A3 ones); tier %s runs on A3" % (spec.get("image"),
                                                                                             tier.get("name")))
        out[name] = {"recipe": recipe["name"], "source": (recipe.get("source") or {}).get("title"),
                     "lines": [str(x) for x in recipe.get("lines") or []], "line": selection.get("line"),
                     "note": selection.get("note"), "superseded": recipe.get("superseded"), "warnings": warnings}
    return out


def recipe_choice_lines(specs):
    """plan.yml's lines of recipe_choices."""
    lines = []
    for name, c in sorted(recipe_choices(specs).items()):
        lines.append("instance %s: recipe %s, validated on vLLM-Ascend %s; the image's line: %s" % (
            name, c["recipe"], ", ".join(c["lines"]) or "(none named)", c["line"] or "unknown"))
        lines.append("  source: %s" % c["source"])
        if c["note"]:
            lines.append("  note: %s" % c["note"])
        if c["superseded"]:
            lines.append("  superseded upstream: %s (%s)" % (c["superseded"]["by"], c["superseded"]["source"]))
        lines.extend("  warning: %s" % w for w in c["warnings"])
    return lines


def recipe_diff_lines(containers):
    """plan.yml's per-host difference from the recipe: one line per flag or environment key, with why."""
    out = []
    for host, pair in sorted(containers.items()):
        engine = (pair or {}).get("engine")
        if not engine:
            continue
        rows = engine["recipe_diff"]
        out.append("%s: recipe %s%s" % (host, engine["recipe"], "" if rows else ", exactly"))
        for r in rows:
            name = "env " + r["key"] if r["kind"] == "env" else r["key"]
            out.append("  %s: %s -> %s (%s)" % (name, r["recipe"], r["runs"], r["why"] or "NOT EXPLAINED"))
    return out


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


# what every engine of a memcache KV pool must agree on (the Kimi-K3 page's 8P8D prefill environment: the pool keys
# blocks by Python's hash, so PYTHONHASHSEED must match; the others configure the pool's fabric and timeouts)
KV_POOL_SAME_ENV = ("PYTHONHASHSEED", "MMC_LOCAL_CONFIG_PATH", "ASCEND_ENABLE_USE_FABRIC_MEM", "ACL_OP_INIT_MODE",
                    "HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT")


def kv_pool_problems(containers):
    """Per instance with a memcache KV pool: the environment keys its engines (those that read mmc-local.conf) must
    share, each set and identical on every one of them, or a line naming the key, the values and the hosts."""
    out = []
    pools = sorted(set(c["kv_pool"]["instance"] for c in containers.values() if c.get("kv_pool")))
    for name in pools:
        engines = dict((h, c["engine"]) for h, c in sorted(containers.items())
                       if c.get("engine") and c["engine"]["instance"] == name and c["engine"].get("files"))
        if not engines:
            out.append("instance %s: npuops_kv_pool is memcache, but no engine reads mmc-local.conf (the recipe's "
                       "prefill role sets no MMC_LOCAL_CONFIG_PATH); use a recipe that publishes the pool" % name)
        for key in KV_POOL_SAME_ENV:
            seen = {}
            for h, e in engines.items():
                seen.setdefault(e["env"].get(key), []).append(h)
            if len(seen) > 1 or None in seen:
                out.append("instance %s: %s must be set and the same on every engine of the memcache KV pool (%s); "
                           "set it once for all of them (npuops_env_overrides in group_vars)" % (
                               name, key, "; ".join("%s on %s" % ("unset" if v is None else v, ", ".join(hs))
                                                    for v, hs in sorted(seen.items(), key=lambda kv: str(kv[0])))))
    return out


def serve_previous(engine, host, info):
    """The engine as it ran before a rolling update restarted it (``info``: vllm_container_info's entry for it, read
    before the restart): the plan's engine with the image, command, environment, devices, mounts, shm size,
    privilege and labels of the spec its container carried. What a rollout whose new configuration answers wrongly
    puts back. The secrets come from the inventory again (the label holds only their digests)."""
    spec = (info or {}).get("spec")
    if not spec or not spec.get("command"):
        raise AnsibleFilterError("serve_previous: %s: its engine %s had no npuops spec before the restart (%s), so its "
                                 "previous configuration cannot be restored; it stays out of rotation: deploy the "
                                 "configuration it should run" % (host, engine.get("name"), "not found" if not
                                                                  (info or {}).get("exists") else "not npuops'"))
    moved = [flag for flag in RESTORE_SAME if container.flag_words(spec["command"], flag) != container.flag_words(engine["command"], flag)]
    if moved:
        raise AnsibleFilterError("serve_previous: %s: the change also moves %s (%s -> %s), which the plan's waits, checks "
                                 "and gateway follow, so the previous configuration cannot come back by itself; the "
                                 "instance stays out of rotation on the new one: deploy the configuration it should "
                                 "run" % (host, ", ".join(moved), " ".join(container.flag_words(spec["command"], moved[0])),
                                          " ".join(container.flag_words(engine["command"], moved[0]))))
    out = dict(engine)
    out.update((k, spec[k]) for k in ("image", "command", "env", "devices", "mounts", "shm_size", "privileged",
                                      "labels") if k in spec)
    return out


def restore_source(running, record, gates):
    """What a configuration that fails its gate is replaced by: the configuration that ran before when it passed
    the gates (or no gate asked), else the last that passed (the instance's record, instance_verdict), else the one
    that ran before (never judged). `running`: instance_configs' entry of the instance before the restart.
    -> {config, engines: {host: {container: {exists, spec}}}, why}."""
    state, _detail = verdict.gate_state(record, running.get("config"), gates)
    good = verdict.last_good(record)
    if state == verdict.PASSED or not good:
        why = {verdict.PASSED: "passed its gates", verdict.UNMEASURED: "no gate judged",
               verdict.UNKNOWN: "could not be judged"}.get(
                   state, "failed its gates too: no configuration that passed is recorded")
        return {"config": running.get("config"), "engines": running.get("engines") or {},
                "why": "the configuration it ran before, which %s" % why}
    return good


# what the plan's waits (ready URL, rendezvous peers), the accuracy gate and the gateway address: a restore keeps them
RESTORE_SAME = ("--host", "--port", "--served-model-name", "--master-addr", "--master-port", "--data-parallel-address",
                "--data-parallel-rpc-port")
