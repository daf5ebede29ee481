#!/usr/bin/env python3
"""Molecule verify: every running container matches what the tier document, its default recipe and the inventory
say, derived here from first principles - not with the filter that made the deployment. Of the recipe
(data/recipes), every flag and environment value that names no variable must be in the container as the source
wrote it, unless a row of the deviations table (data/deviations.yml) names that flag or key.

  verify_containers.py TIER_YML INVENTORY_JSON INSPECT_JSON

INVENTORY_JSON is `ansible-inventory --list`; INSPECT_JSON is {host: `podman inspect vllm` of that host}.
Prints one line per mismatch and exits 1 when there is any.
"""
import glob
import json
import os
import shlex
import sys

import yaml

# What every vLLM-Ascend engine container needs from its host, read-only at the same path (vllm-ascend
# docs/source/installation.md and the PD tutorial's docker run): written out here, not imported from the code.
HOST_MOUNTS = ["/usr/local/dcmi", "/usr/local/Ascend/driver/tools/hccn_tool", "/usr/local/bin/npu-smi",
               "/usr/local/Ascend/driver/lib64", "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info",
               "/etc/hccn.conf"]
MGMT_DEVICES = ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]


def flags(argv):
    """`vllm serve M --a 1 --b` -> {"--a": "1", "--b": True}."""
    out = {}
    i = 3
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = True
            i += 1
    return out


def number(text):
    try:
        return float(text)
    except ValueError:
        return None


def recipe_literals(tier_path, tier_name, role):
    """({--flag: value}, {ENV: value}) of the tier's default recipe for one role (leader, worker, prefill, decode):
    the values that name no variable, minus what a deviation row names."""
    data = os.path.dirname(os.path.dirname(os.path.abspath(tier_path)))
    recipe = None
    for path in sorted(glob.glob(os.path.join(data, "recipes", "*.yml"))):
        with open(path) as f:
            doc = yaml.safe_load(f)
        if doc.get("default") and doc.get("tier") == tier_name:
            recipe = doc
    with open(os.path.join(data, "deviations.yml")) as f:
        rows = yaml.safe_load(f)["deviations"]
    named_flags = set("--" + r["flag"].replace("_", "-") for r in rows if "flag" in r)
    named_env = set(r["env"] for r in rows if "env" in r)
    text = recipe["roles"][role]["command"].replace("\\\n", " ")
    argv = shlex.split(text)
    argv = ["--" + a[2:].replace("_", "-") if a.startswith("--") else a for a in argv]
    literal = dict((k, v) for k, v in flags(argv).items()
                   if k not in named_flags and not (isinstance(v, str) and ("$" in v or "<" in v)))
    env = {}
    for layer in (recipe.get("env"), recipe["roles"][role].get("env")):
        for k, v in (layer or {}).items():
            if k not in named_env and "$" not in str(v) and "<" not in str(v):
                env[k] = str(v)
    return literal, env


def expect(problems, host, what, seen, wanted):
    if seen != wanted:
        problems.append("%s: %s is %r, the tier, recipe and inventory say %r" % (host, what, seen, wanted))


def main(tier_path, inventory_path, inspect_path):
    with open(tier_path) as f:
        tier = yaml.safe_load(f)
    with open(inventory_path) as f:
        inv = json.load(f)
    with open(inspect_path) as f:
        inspected = json.load(f)
    hv = inv["_meta"]["hostvars"]
    nodes = inv["npu_nodes"]["hosts"]
    problems = []
    for group in tier["groups"]:
        wanted_group = inv.get(group["inventory_group"], {}).get("hosts", []) if group["inventory_group"] != \
            "npu_nodes" else nodes
        members = [h for h in nodes if h in wanted_group]
        expect(problems, group["name"], "the number of hosts", len(members), group["nodes"])
        leader = members[0]
        for rank, host in enumerate(members):
            info = inspected[host][0]
            v = hv[host]
            argv = info["Config"]["Cmd"]
            if argv[:2] == ["/bin/sh", "-c"] and argv[3:4] == ["npuops-secrets"]:
                argv = argv[4:]  # the wrapper that exports podman's mounted secrets
            f = flags(argv)
            expect(problems, host, "the program", argv[:3], ["vllm", "serve", v["npuops_model_dir"]])
            expect(problems, host, "--tensor-parallel-size", f.get("--tensor-parallel-size"), str(group["tp"]))
            serves = group["launch"] == "dp_external" or rank == 0
            expect(problems, host, "--headless", f.get("--headless", False), not serves)
            if serves:
                expect(problems, host, "--host", f.get("--host"), v["npuops_node_ip"])
                expect(problems, host, "--port", f.get("--port"), str(tier["ports"]["api"]))
            if group["launch"] == "multinode":
                expect(problems, host, "--nnodes", f.get("--nnodes"), str(group["nodes"]))
                expect(problems, host, "--node-rank", f.get("--node-rank"), str(rank))
                expect(problems, host, "--master-addr", f.get("--master-addr"), hv[leader]["npuops_node_ip"])
            else:
                expect(problems, host, "--data-parallel-size", f.get("--data-parallel-size"), str(group["dp"]))
                expect(problems, host, "--data-parallel-address", f.get("--data-parallel-address"),
                       hv[leader]["npuops_node_ip"])
                rank_flag = "--data-parallel-rank" if group["launch"] == "dp_external" else \
                    "--data-parallel-start-rank"
                if group["launch"] == "dp_external" or rank > 0:
                    expect(problems, host, rank_flag, f.get(rank_flag), str(rank * group.get("dp_local", 1)))
            if group.get("kv_role"):
                kv = json.loads(f.get("--kv-transfer-config", "{}"))
                expect(problems, host, "kv_role", kv.get("kv_role"), group["kv_role"])
                expect(problems, host, "kv_port", kv.get("kv_port"), str(group["kv_port"]))
            expect(problems, host, "--enable-expert-parallel", f.get("--enable-expert-parallel", False),
                   bool(group.get("expert_parallel")))
            role = {"kv_producer": "prefill", "kv_consumer": "decode"}.get(group.get("kv_role")) or \
                ("leader" if rank == 0 else "worker")
            literal_flags, literal_env = recipe_literals(tier_path, tier["name"], role)
            for flag, value in sorted(literal_flags.items()):
                seen = f.get(flag)
                if isinstance(value, str) and value.startswith("{"):
                    seen, value = json.loads(seen) if seen else None, json.loads(value)
                elif isinstance(value, str) and isinstance(seen, str) and number(value) is not None:
                    seen, value = number(seen), number(value)  # 0.90 as written, 0.9 as rendered
                expect(problems, host, flag, seen, value)
            env = dict(e.split("=", 1) for e in info["Config"]["Env"])
            wanted_env = {"HCCL_IF_IP": v["npuops_node_ip"], "VLLM_HOST_IP": v["npuops_node_ip"],
                          "GLOO_SOCKET_IFNAME": v["npuops_nic"], "TP_SOCKET_IFNAME": v["npuops_nic"],
                          "HCCL_SOCKET_IFNAME": v["npuops_nic"],
                          "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(i) for i in range(tier["dies_per_node"]))}
            wanted_env.update(literal_env)
            for key, value in sorted(wanted_env.items()):
                expect(problems, host, "env %s" % key, env.get(key), value)
            devices = sorted(d["PathOnHost"] for d in info["HostConfig"]["Devices"])
            expect(problems, host, "the devices", devices,
                   sorted(["/dev/davinci%d" % i for i in range(tier["dies_per_node"])] + MGMT_DEVICES))
            mounts = sorted((m["Source"], m["Destination"], bool(m.get("RW"))) for m in info["Mounts"]
                            if m["Destination"] != "/dev/shm")
            expect(problems, host, "the mounts (source, destination, read-write)", mounts,
                   sorted((p, p, False) for p in HOST_MOUNTS + [v["npuops_model_dir"]]))
            labels = info["Config"]["Labels"]
            expect(problems, host, "label io.npuops.group", labels.get("io.npuops.group"), group["name"])
            expect(problems, host, "label io.npuops.role", labels.get("io.npuops.role"),
                   "leader" if rank == 0 else "worker")
            expect(problems, host, "running", info["State"]["Running"], True)
    for p in problems:
        print(p)
    print("%d containers checked, %d problem(s)" % (sum(len(inspected[h]) for h in inspected), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
