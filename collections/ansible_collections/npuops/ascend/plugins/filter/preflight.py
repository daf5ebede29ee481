# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The preflight go/no-go: per-node results + cluster-wide rules -> one table of named failures.

``ping_mesh`` turns every node's /etc/hccn.conf addresses into per-device ping targets;
``preflight_report`` gathers what host_check (with its NPU discovery) and hccn_check found on every node, adds the
checks only the whole cluster can answer (unique device addresses, one TLS setting everywhere, the
capacity plan), and returns rows ``{host, check, device, observed, expected, fix, severity}``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import re

from ansible_collections.npuops.ascend.plugins.filter import gateway, monitoring
from ansible_collections.npuops.ascend.plugins.module_utils import hccn, npu_smi
from ansible_collections.npuops.ascend.plugins.plugin_utils import results, versions

HBM_IDLE_MAX_MB = 8192  # an idle A3 die shows ~3.2-3.4 GB used (firmware); more means someone holds it


def ping_mesh(addresses, mode="auto"):
    """{host: {phy: address}} -> {host: [{device, address}]}; mode auto|full|sample (see hccn.plan_mesh).

    auto: the full mesh while it costs at most 4 sequential pings per device (up to 5 nodes), the covering
    sample beyond that, so preflight time stays flat as the cluster grows.
    """
    clean = dict((h, dict((int(k), v) for k, v in (a or {}).items())) for h, a in addresses.items())
    if mode == "auto":
        mode = "full" if len(clean) <= 5 else "sample"
    plan = hccn.plan_mesh(clean, mode)
    return dict((h, [{"device": phy, "address": t} for phy, ts in sorted(per.items()) for t in ts])
                for h, per in plan.items())


def _dig(value, path):
    for key in path.split(".") if path else []:
        if value is None:
            return None
        try:
            value = value[key]
        except (KeyError, TypeError, IndexError):
            return None
    return value


def collect(hostvars, hosts, path):
    """{host: hostvars[host].<path>} for the given hosts (None where it is not set)."""
    first, _sep, rest = path.partition(".")
    return dict((h, _dig(results.registered(hostvars, h, first), rest)) for h in hosts)


def npu_result(host_result):
    """The outcome of the NPU discovery that host_check (npu_facts: true) ran with the node's other checks, in the
    shape of an npu_facts result: failed with the reason when the discovery failed, else the module's result."""
    if isinstance(host_result, dict) and host_result.get("npu_error") and not host_result.get("failed"):
        return {"failed": True, "msg": host_result["npu_error"]}
    return host_result


def preflight_gather(hostvars, hosts):
    """What the preflight tasks registered on each host, in the shape preflight_report takes."""
    host_checks = collect(hostvars, hosts, "npuops_host_result")
    return dict((h, {"npu": collect(hostvars, [h], "ansible_facts.npu")[h],
                     "npu_result": npu_result(host_checks[h]),
                     "host_check": host_checks[h],
                     "reach_check": collect(hostvars, [h], "npuops_reach_result")[h],
                     "hccn_check": collect(hostvars, [h], "npuops_hccn_result")[h]}) for h in hosts)


def support_checks(plan, host, gateway_install=True, prometheus_port=monitoring.PROMETHEUS_PORT):
    """host_check's arguments for what `host` does beside engines: a gateway host needs haproxy and keepalived
    (unless npuops may install them), its service and stats ports free or held by its own HAProxy, and the floating
    address; a Prometheus host its port free or held by its own Prometheus. None when the host has no such job."""
    jobs = (plan.get("members") or {}).get(host) or []
    args = {"binaries": [], "ports_free": [], "service_pid_files": [], "address": None}
    if "gateway" in jobs:
        gw = plan["gateway"]
        if not gateway_install:
            args["binaries"] += [{"path": path, "fix": "install the %s package on %s, or set npuops_gateway_install: "
                                  "true to let npuops install it" % (name, host)}
                                 for name, path in (("haproxy", gateway.HAPROXY_BIN),
                                                    ("keepalived", gateway.KEEPALIVED_BIN))]
        args["ports_free"] += [int(gw["port"]), gateway.STATS_PORT]
        args["service_pid_files"] += [gateway.PID_FILE, gateway.KEEPALIVED_PID_FILE]
        args["address"] = gw["vip"]
    if "prometheus" in jobs:
        args["ports_free"].append(int(prometheus_port))
        args["service_pid_files"].append(monitoring.PROMETHEUS_PID_FILE)
    return args if args["ports_free"] else None


def support_rows(hostvars, plan, key):
    """Report rows of the gateway and Prometheus hosts' checks (registered under `key`), and of the floating address:
    it must answer only when a gateway host of the plan holds it (else another machine has it)."""
    rows, answers, held = [], [], []
    for host, jobs in sorted((plan.get("members") or {}).items()):
        res = collect(hostvars, [host], key)[host]
        if not isinstance(res, dict) or res.get("skipped"):
            continue
        if not _ok_result(res):
            rows.append(_module_failure(host, "host_check", res))
            continue
        for p in res.get("failed_checks", []):
            rows.append(row(host, p["check"], p["observed"], p["expected"], p["fix"]))
        for h in res.get("held_by_service", []):
            rows.append(row(host, "port_free", "port %s is held by the service (%s)" % (h["port"], h["owner"]),
                            "port %s free or the service's own" % h["port"], "nothing to do", severity="service"))
        address = res.get("address") or {}
        if address.get("held"):
            held.append(host)
        elif address.get("answers"):
            answers.append(host)
    vip = (plan.get("gateway") or {}).get("vip")
    if answers and not held:
        rows.append(row(answers[0], "vip", "%s answers a ping, and no gateway host of the plan holds it" % vip,
                        "%s free, or held by a gateway host of the plan" % vip,
                        "another machine has the floating address: pick a free one for npuops_gateway_vip, or take "
                        "it off that machine"))
    return rows


def reach_targets(reach, hostvars, key):
    """The plan's reach targets of a worker, each marked `live` when the leader's running service holds that port
    (found by the leader's host_check, registered under `key`): then the worker connects to the service itself."""
    out = []
    for t in reach or []:
        held = (collect(hostvars, [t["host"]], key)[t["host"]] or {}).get("held_by_service") or []
        out.append(dict(t, live=int(t["port"]) in set(int(x["port"]) for x in held)))
    return out


def row(host, check, observed, expected, fix, device=None, severity="error"):
    return {"host": host, "check": check, "device": device, "observed": observed, "expected": expected,
            "fix": fix, "severity": severity}


def _ok_result(res):
    return results.outcome(res)[0] == results.OK


def _module_failure(host, check, res):
    kind, msg = results.outcome(res)
    if kind == results.SKIPPED:
        return row(host, check, "did not run", "ran", "see the task output for %s" % host)
    if kind == results.UNREACHABLE:
        return row(host, "ssh", msg, "reachable over SSH",
                   "check that %s is up, sshd answers and the inventory's address and key are right" % host)
    return row(host, check, msg or "failed", "succeeds", "see the message; run the module by hand on %s" % host)


def image_generation(image):
    """'...:v0.23.0-a3' / '-a3-openeuler' -> A3; other vllm-ascend tags -> A2 (vllm-ascend installation.md: the -a3 images carry the A3 kernels)."""
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    return "A3" if re.search(r"(^|-)a3($|-)", tag) else "A2"


def _hccn_rows(host, result, addr_owner):
    """hccn_check failures as report rows. When every ping from this node to one peer failed, one
    `fabric` row names the node pair instead of a row per device (a cut path, not 16 broken devices)."""
    rows = []
    pings = list(result.get("ping", []))
    by_peer = {}
    for p in pings:
        owner = addr_owner.get(p["target"], [(None, None)])[0]
        by_peer.setdefault(owner[0], []).append(p)
    cut = set()
    for peer, items in by_peer.items():
        if peer is not None and len(items) > 1 and not any(p["ok"] for p in items):
            cut.add(peer)
            rows.append(row(host, "fabric", "all %d pings from %s to %s failed (devices %s)" % (
                len(items), host, peer, ",".join(str(d) for d in sorted({p["phy_id"] for p in items}))),
                "%s reaches %s over the NPU fabric" % (host, peer),
                "check the fabric path between %s and %s: switch ports, VLAN/routes, TLS on both sides"
                % (host, peer)))
    for p in result.get("failed_checks", []):
        observed = p["observed"]
        if p["check"] == "ping":
            target = observed.split(" to ", 1)[-1].split(":", 1)[0]
            owners = addr_owner.get(target)
            if owners and owners[0][0] in cut:
                continue
            if owners:
                observed = "%s (%s device %s)" % (observed, owners[0][0], owners[0][1])
        rows.append(row(host, p["check"], observed, p["expected"], p["fix"], device=p["phy_id"]))
    return rows


def image_rows(hosts_results, plan, containers):
    """What each engine image really holds against what its command needs, and one image per instance: -> (rows,
    {host: what was read})."""
    rows, held = [], {}
    for host, r in sorted(hosts_results.items()):
        img = (r.get("host_check") or {}).get("image")
        engine = ((containers or {}).get(host) or {}).get("engine") or {}
        if not img or not engine:
            continue
        held[host] = img
        where = "the command of recipe %s" % engine.get("recipe")
        if img.get("error"):
            rows.append(row(host, "image_versions", img["error"], "the versions readable from the image",
                            "check that %s runs on %s (python3 in the image, the container engine)" % (img["image"], host),
                            severity="warning"))
        elif img.get("present") and img.get("versions"):
            errors, warnings = versions.held_problems(engine.get("needs"), img["versions"], img["image"], where)
            for msg in errors:
                rows.append(row(host, "image_versions", msg, "an image that serves %s" % where,
                                "set npuops_image to an image that has it (docs/versions.md), or choose another recipe"))
            for msg in warnings:
                rows.append(row(host, "image_versions", msg, "the versions its tag says", "pin the image's digest in "
                                "npuops_image (repository:tag@sha256:...)", severity="warning"))
    for name, inst in sorted(((plan or {}).get("instances") or {}).items()):
        reads = [(h, held[h]) for h in inst.get("hosts") or [] if h in held and held[h].get("present")]
        for host, ident, first_host, first_id in versions.differing_images(reads):
            rows.append(row(host, "image_digest", "%s runs %s %s, %s runs %s" % (
                host, held[host]["image"], ident, first_host, first_id),
                "one image on every node of instance %s" % name,
                "pull the same image on %s and %s: pin it, npuops_image: repository:tag@sha256:..." % (
                    first_host, host)))
    return rows, held


FABRIC_MEM_RECORD = "/var/lib/npuops/instances/%s-fabric-mem.json"


def fabric_mem_instances(containers, plan):
    """The instances whose engines move KV through fabric memory as rendered (ASCEND_ENABLE_USE_FABRIC_MEM=1), with the
    file on each one's first host that keeps preflight's finding: {instance: {host, path}}."""
    out = {}
    for name, inst in sorted(((plan or {}).get("instances") or {}).items()):
        for h in inst.get("hosts") or []:
            env = ((((containers or {}).get(h) or {}).get("engine") or {}).get("env") or {})
            if str(env.get("ASCEND_ENABLE_USE_FABRIC_MEM")) == "1":
                out[name] = {"host": inst["hosts"][0], "path": FABRIC_MEM_RECORD % name}
                break
    return out


def fabric_mem_off(slurped):
    """The instances whose kept finding says their KV moves without fabric memory: `slurped` is the registered
    ansible.builtin.slurp loop over fabric_mem_instances' items (a finding that is missing or unreadable keeps the
    recipe's fabric memory)."""
    out = []
    for res in (slurped or {}).get("results") or []:
        try:
            record = json.loads(base64.b64decode(res.get("content") or "").decode() or "{}")
        except (ValueError, TypeError, AttributeError):
            record = {}
        if isinstance(record, dict) and record.get("fabric_mem") is False:
            out.append(res["item"]["key"])
    return sorted(out)


def line_rows(hosts_results, plan, containers, held):
    """What the image's vLLM-Ascend line asks of the nodes: fabric memory's prerequisites on every node of an instance
    whose engines use it (a node short of them moves the instance to the fallback: info rows, and the instance in the
    answer), and no jemalloc preload where the line refuses it. -> (rows, [instances that fall back])."""
    rows, fallback = [], []
    for name, inst in sorted(((plan or {}).get("instances") or {}).items()):
        engines = [(h, ((containers or {}).get(h) or {}).get("engine") or {}) for h in inst.get("hosts") or []]
        uses_fabric = [h for h, e in engines if str((e.get("env") or {}).get("ASCEND_ENABLE_USE_FABRIC_MEM")) == "1"]
        short = []
        for host in uses_fabric:
            facts = (hosts_results.get(host) or {}).get("npu") or {}
            img = held.get(host) or {}
            got = (img.get("versions") or {}) if img.get("present") else {}
            lacks = versions.fabric_mem_shortfall(facts.get("driver_version"), got.get("cann"), got.get("mooncake"))
            if lacks:
                short.append((host, lacks))
        for host, lacks in short:
            rows.append(row(host, "fabric_mem", "; ".join(lacks),
                            "HDK >= %s, or >= %s with Mooncake >= %s; CANN >= %s (vllm-ascend kv_pool.md)" % (
                                versions.FABRIC_MEM["hdk"], versions.FABRIC_MEM["hdk_with_mooncake"],
                                versions.FABRIC_MEM["mooncake"], versions.FABRIC_MEM["cann"]),
                            "instance %s moves KV over RoCE instead of fabric memory (deviation fabric_mem_fallback: "
                            "HCCL_INTRA_ROCE_ENABLE=1); upgrade the HDK on %s to use fabric memory" % (name, host),
                            severity="service"))
        if short:
            fallback.append(name)
        for host, engine in engines:
            img = held.get(host) or {}
            info = versions.image_versions(engine.get("image"))
            preloads = versions.jemalloc_preloads(img.get("preload")) if img.get("present") else []
            if not info.get("refuses_jemalloc") or not preloads:
                continue
            cleared = [p for p in preloads if p.startswith("LD_PRELOAD=")]
            stuck = [p for p in preloads if not p.startswith("LD_PRELOAD=")]
            if cleared and (engine.get("env") or {}).get("LD_PRELOAD") == "":
                rows.append(row(host, "jemalloc", "the image preloads jemalloc (%s)" % cleared[0],
                                "no jemalloc preload on vLLM-Ascend %s" % info["line"],
                                "nothing to do: the engine's environment clears it (deviation no_jemalloc_preload)",
                                severity="service"))
            for where in stuck + [p for p in cleared if (engine.get("env") or {}).get("LD_PRELOAD") != ""]:
                fix = ("vLLM-Ascend %s on Atlas 800 A3 does not support a jemalloc preload (vllm-ascend #17155): "
                       "remove it from %s (a preload file the container engine mounts, or the image's own), or use an "
                       "image built without it (#17146)" % (info["line"], host))
                rows.append(row(host, "jemalloc", where, "no jemalloc preload on vLLM-Ascend %s" % info["line"], fix))
    return rows, fallback


def preflight_report(hosts_results, tier, plan=None, capacity=None, image=None, requirements=None,
                     strict=True, support=None, containers=None):
    """`hosts_results`: {host: {npu: facts or None, npu_result, host_check, hccn_check}}; `support`: the rows of the
    gateway and Prometheus hosts (support_rows); `containers`: what each host runs (serve_containers), whose images
    are checked against what they really hold."""
    rows = list(support or [])
    found, images = image_rows(hosts_results, plan, containers)
    rows.extend(found)
    found, fabric_mem_off = line_rows(hosts_results, plan, containers, images)
    rows.extend(found)
    want_gen = tier.get("generation")
    want_dies = int(tier.get("dies_per_node", 16))
    req = requirements or {}
    min_driver, min_cann = req.get("min_driver"), req.get("min_cann")
    addr_owner = {}
    for host, r in sorted(hosts_results.items()):
        for phy, addr in ((r.get("host_check") or {}).get("hccn_addresses") or {}).items():
            addr_owner.setdefault(addr, []).append((host, int(phy)))

    tls_values = {}
    for host, r in sorted(hosts_results.items()):
        npu_res = r.get("npu_result")
        facts = r.get("npu")
        if not _ok_result(npu_res) or not facts:
            rows.append(_module_failure(host, "npu_facts", npu_res))
        else:
            if facts.get("generation") != want_gen or facts.get("chip_count") != want_dies:
                rows.append(row(host, "chips", "%s with %s dies (%s cards x %s chips)" % (
                    facts.get("generation"), facts.get("chip_count"), facts.get("card_count"),
                    facts.get("chips_per_card")), "%s with %d dies" % (want_gen, want_dies),
                    "this tier runs on %s nodes with %d dies each; check npu-smi info on %s (a chip missing means "
                    "a driver or hardware fault) or pick the tier for this hardware" % (want_gen, want_dies, host)))
            if image and facts.get("generation") and image_generation(image) != facts["generation"]:
                suffix = "-a3" if facts["generation"] == "A3" else "none"
                rows.append(row(host, "image", "%s is an %s image" % (image, image_generation(image)),
                                "an %s image (tag suffix %s)" % (facts["generation"], suffix),
                                "A3 needs the -a3 image and A2 the plain one (the CANN kernels differ): fix npuops_image"))
            phy_of = dict(((c["card"], c["chip"]), c["phy_id"]) for c in facts.get("chips", []))
            for c in facts.get("chips", []):
                if c.get("health") != "OK":
                    seen = "card %s chip %s health %s" % (c["card"], c["chip"], c["health"])
                    rows.append(row(host, "chip_health", seen,
                                    "OK", "npu-smi info -t health -i %s -c %s shows the error code; clear the fault "
                                    "or replace the card before launch" % (c["card"], c["chip"]), device=c["phy_id"]))
            service_pids = set((r.get("host_check") or {}).get("service_pids") or [])
            for p in facts.get("processes", []):
                phy = phy_of.get((p["card"], p["chip"]))
                seen = "pid %s (%s) holds %s MB on card %s chip %s" % (p["pid"], p.get("name") or "?",
                                                                       p.get("memory_mb"), p["card"], p["chip"])
                if _int(p["pid"]) in service_pids:
                    rows.append(row(host, "hbm_free", seen + ": the service's own engine", "no foreign process on "
                                    "the NPUs", "nothing to do", device=phy, severity="service"))
                    continue
                rows.append(row(host, "hbm_free", seen,
                                "no process on the NPUs", "stop pid %s on %s (a stale vLLM or training job?); the engine "
                                "needs the whole HBM" % (p["pid"], host), device=phy))
            busy_devices = set(phy_of.get((p["card"], p["chip"])) for p in facts.get("processes", []))
            for c in facts.get("chips", []):
                if c.get("hbm_used_mb") and c["hbm_used_mb"] > HBM_IDLE_MAX_MB and c["phy_id"] not in busy_devices:
                    rows.append(row(host, "hbm_free", "%s of %s MB used with no process listed" % (
                        c["hbm_used_mb"], c["hbm_total_mb"]), "at most %d MB used when idle" % HBM_IDLE_MAX_MB,
                        "something in another container holds HBM on card %s chip %s: find and stop it"
                        % (c["card"], c["chip"]), device=c["phy_id"]))
            if min_driver and npu_smi.version_tuple(facts.get("driver_version")) < npu_smi.version_tuple(min_driver):
                rows.append(row(host, "driver", "driver %s" % facts.get("driver_version"),
                                "driver >= %s for %s" % (min_driver, image),
                                "upgrade the Ascend driver and firmware (HDK) on %s to %s or newer, or pick an image "
                                "built for this driver" % (host, min_driver)))
            if min_cann and facts.get("cann_version") and \
                    npu_smi.version_tuple(facts["cann_version"]) < npu_smi.version_tuple(min_cann):
                rows.append(row(host, "cann", "host CANN %s" % facts["cann_version"], "CANN >= %s" % min_cann,
                                "upgrade the host CANN toolkit on %s (or remove it; the image brings its own)" % host))

        hc = r.get("host_check")
        if not _ok_result(hc):
            rows.append(_module_failure(host, "host_check", hc))
        else:
            for p in hc.get("failed_checks", []):
                rows.append(row(host, p["check"], p["observed"], p["expected"], p["fix"], device=p.get("phy_id")))
            for held in hc.get("held_by_service", []):
                seen = "port %s is held by the service (%s)" % (held["port"], held["owner"])
                rows.append(row(host, "port_free", seen, "port %s free or the service's own" % held["port"],
                                "nothing to do", severity="service"))
        rc = r.get("reach_check")
        if isinstance(rc, dict) and not rc.get("skipped"):
            if not _ok_result(rc):
                rows.append(_module_failure(host, "reach", rc))
            else:
                for p in rc.get("failed_checks", []):
                    rows.append(row(host, p["check"], p["observed"], p["expected"], p["fix"]))

        hk = r.get("hccn_check")
        if not _ok_result(hk):
            rows.append(_module_failure(host, "hccn_check", hk))
        else:
            rows.extend(_hccn_rows(host, hk, addr_owner))
            for d in hk.get("devices", []):
                if d.get("tls_switch") is not None:
                    tls_values.setdefault(d["tls_switch"], []).append((host, d["phy_id"]))

    for addr, owners in sorted(addr_owner.items()):
        if len(owners) > 1:
            for host, phy in owners[1:]:
                seen = "device %s has %s, as %s device %s" % (phy, addr, owners[0][0], owners[0][1])
                fix = "give %s device %s its own address (hccn_tool -i %s -ip -s address ...)" % (host, phy, phy)
                rows.append(row(host, "hccn_unique", seen, "device addresses unique across the cluster", fix,
                                device=phy))
    if len(tls_values) > 1:
        usual = max(sorted(tls_values), key=lambda v: len(tls_values[v]))
        for value, where in sorted(tls_values.items()):
            if value == usual:
                continue
            for host, phy in where:
                rows.append(row(host, "tls", "tls switch %s" % value, "tls switch %s, as on the other %d devices"
                                % (usual, len(tls_values[usual])),
                                "make TLS the same on every device of every node: hccn_tool -i %s -tls -s enable %s"
                                % (phy, usual), device=phy))

    first_instance = next(iter((plan or {}).get("instances", {}).values()), {})
    for name, cap in sorted((capacity or {}).items()):
        where = first_instance.get("groups", {}).get(name, {}).get("leader", "cluster")
        for msg in cap.get("errors", []):
            rows.append(row(where, "capacity", msg, "the model fits with room for KV cache",
                            "use a tier with more dies, a smaller quantization, or a lower max_model_len"))
        for msg in cap.get("warnings", []):
            rows.append(row(where, "capacity", msg, "max_model_len x max_num_seqs within the KV estimate",
                            "lower max_num_seqs or max_model_len in npuops_model_overrides if every sequence must fit",
                            severity="warning"))

    rows.sort(key=lambda x: (x["host"], x["check"], -1 if x["device"] is None else x["device"]))
    failures = [x for x in rows if x["severity"] == "error"]
    warnings = [x for x in rows if x["severity"] == "warning"]
    service = [x for x in rows if x["severity"] == "service"]
    return {"ok": not failures, "go": not failures or not strict, "failures": failures, "warnings": warnings,
            "service": service, "hosts": sorted(hosts_results), "images": images, "fabric_mem_off": fabric_mem_off,
            "support_hosts": sorted(set(h for h, jobs in ((plan or {}).get("members") or {}).items()
                                        if set(jobs) & {"gateway", "prometheus"})),
            "table": format_table(rows)}


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def format_table(rows):
    if not rows:
        return ["preflight: every check passed"]
    head = ("host", "check", "dev", "observed", "expected", "fix")
    data = [(x["host"], x["check"] + {"error": "", "warning": " (warning)", "service": " (service)"}[x["severity"]],
             "" if x["device"] is None else str(x["device"]), x["observed"], x["expected"], x["fix"]) for x in rows]
    widths = [min(max(len(r[i]) for r in data + [head]), cap) for i, cap in enumerate((12, 20, 3, 72, 48, 400))]
    fmt = "  ".join("%%-%ds" % w for w in widths[:-1]) + "  %s"
    out = [fmt % head]
    for r in sorted(data, key=lambda r: (r[0], r[1], r[2])):
        out.append(fmt % tuple(c[:w] if i < 5 else c for i, (c, w) in enumerate(zip(r, widths))))
    return out


class FilterModule(object):
    def filters(self):
        return {"ping_mesh": ping_mesh, "preflight_report": preflight_report,
                "fabric_mem_instances": fabric_mem_instances, "fabric_mem_off": fabric_mem_off,
                "collect": collect, "preflight_gather": preflight_gather, "reach_targets": reach_targets,
                "preflight_support_checks": support_checks, "preflight_support_rows": support_rows}
