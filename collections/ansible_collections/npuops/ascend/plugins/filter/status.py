# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""service_status: the plan, what every host's containers are, and the token probes -> a verdict per instance.

healthy: every container of the instance runs (made by npuops), every serving engine answers /health, and a
token comes out of the front door. degraded: a token comes out, but something of the instance is wrong (a
container not running, an engine's /health failing, a host unreachable). busy: no token for the probe within its
timeout, while the engines have requests in flight and step (their /metrics, read beside the probe): healthy for the
exit code, never restarted. down: no token comes out and nothing moves. The service is healthy when every instance
is healthy or busy.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.filter import gateway as gateway_config
from ansible_collections.npuops.ascend.plugins.plugin_utils.model import topology
from ansible_collections.npuops.ascend.plugins.module_utils import verdict
from ansible_collections.npuops.ascend.plugins.plugin_utils import results, versions

HEALTHY = "healthy"
DEGRADED = "degraded"
DOWN = "down"
# requests wait and the engines still step: healthy for the exit code, and never restarted by recover
BUSY = "busy"
# it answers, but its running configuration failed a gate (its answers): out of rotation, non-zero
WRONG = "wrong"
ENGINE_ROLES = ("leader", "worker", "prefill", "decode")


def _containers_of(plan, containers, instance):
    """[(host, container name, role)] the plan puts in `instance`."""
    out = []
    for host in plan["instances"][instance]["hosts"]:
        engine = (containers.get(host) or {}).get("engine")
        if engine:
            out.append((host, engine["name"], engine["role"]))
    proxy = plan["instances"][instance].get("proxy")
    if proxy:
        out.append((proxy["host"], containers[proxy["host"]]["proxy"]["name"], "proxy"))
    pool = plan["instances"][instance].get("kv_pool")
    if pool:  # the memcache KV pool's MetaService: its prefill engines need it
        out.append((pool["host"], containers[pool["host"]]["kv_pool"]["name"], "kv_pool"))
    return out


def _container_problem(host, name, result):
    if not isinstance(result, dict) or result.get("skipped"):
        return "%s: not checked" % host
    if result.get("unreachable"):
        return "%s: unreachable (%s)" % (host, (result.get("msg") or "no answer").splitlines()[0][:200])
    if result.get("failed"):
        return "%s: %s" % (host, (result.get("msg") or "the container check failed")[:300])
    c = (result.get("containers") or {}).get(name) or {}
    if not c.get("exists"):
        return "%s: container %s does not exist" % (host, name)
    if not c.get("ours"):
        return "%s: container %s was not made by npuops" % (host, name)
    if not c.get("running"):
        last = [line for line in (c.get("log") or "").splitlines() if line.strip()][-1:]
        return "%s: container %s %s (exit code %s)%s" % (host, name, c.get("status") or "is not running",
                                                         c.get("exit_code"), ("; last log line: " + last[0][:200])
                                                         if last else "")
    return None


def running_images(plan, hostvars, containers, key, instance=None):
    """{host: {image, id, digest, versions, error}}: what each running engine's image holds (vllm_container_info with
    read_images, registered as `key` on every host), for the engines of `instance` or of every instance."""
    out = {}
    for name in sorted(plan["instances"]) if instance is None else [instance]:
        for host, cname, role in _containers_of(plan, containers, name):
            result = results.registered(hostvars, host, key)
            found = ((result if isinstance(result, dict) else {}).get("containers") or {}).get(cname) or {}
            if role not in ("proxy", "kv_pool") and found.get("image"):
                read = found["image"]
                out[host] = dict((k, read.get(k)) for k in ("id", "digest", "versions"))
                # the image the container runs (its spec), not the inventory's: they differ until a deploy applies it
                out[host]["image"] = (found.get("spec") or {}).get("image") or containers[host]["engine"]["image"]
                if read.get("error"):
                    out[host]["error"] = read["error"]
    return out


def _images(plan, containers, hostvars, key, instance):
    """-> {"images": running_images of `instance`, "image": the one they share or None, "image_problems": [nodes whose
    image differs from the first's]}."""
    held = running_images(plan, hostvars, containers, key, instance)
    reads = [(h, held[h]) for h in plan["instances"][instance]["hosts"] if h in held]
    problems = ["%s runs image %s, %s runs %s: pin one digest in npuops_image (repository:tag@sha256:...) and "
                "deploy again" % (host, ident, first_host, first_id)
                for host, ident, first_host, first_id in versions.differing_images(reads)]
    shared = dict(reads[0][1]) if reads and not problems else None
    return {"images": held, "image": shared, "image_problems": problems}


def _gate_text(entry):
    gate = entry.get("gate")
    if not gate or entry["state"] == WRONG:
        return ""
    return "; answers %s" % ("not measured" if gate["state"] == verdict.UNMEASURED else gate["state"])


def _model_text(entry):
    model = entry.get("model") or {}
    if not model.get("served_model_name"):
        return ""
    draft = " with draft %s (%s speculative tokens)" % (model["draft"], model.get("num_speculative_tokens")) \
        if model.get("draft") else ""
    return "; serves %s from %s%s" % (model["served_model_name"], model.get("model_dir") or "?", draft)


def _image_text(entry):
    if entry.get("image_problems"):
        return "; " + "; ".join(entry["image_problems"])
    image = entry.get("image") or {}
    if not image:
        return ""
    if image.get("versions"):
        held = versions.held_text(image["versions"])
    else:
        held = "versions not read: %s" % (image.get("error") or "unknown")
    return " [%s; %s]" % (held, image.get("digest") or image.get("id"))


GATEWAY = "gateway"


def gateway_status(plan, hostvars, key, probes, busy=False):
    """The front door of replicas: the floating address answers a token, HAProxy and keepalived run on every gateway
    host, and which instance's servers are out of rotation (drained or in maintenance) at which host.
    -> {state, reason, problems, hosts: {host: {...}}, out_of_rotation: {instance: ["gw01 DRAIN", ...]}} or None."""
    gw = plan.get("gateway")
    if not gw:
        return None
    problems, hosts, out = [], {}, {}
    instance_of = dict((server, inst) for _backend, server, inst in gateway_config.servers(gw))
    for host in gw["hosts"]:
        res = results.registered(hostvars, host, key, {}) or {}
        if res.get("unreachable"):
            problems.append("%s: unreachable (%s)" % (host, (res.get("msg") or "no answer").splitlines()[0][:200]))
            continue
        if res.get("failed") or res.get("skipped") or "haproxy" not in res:
            problems.append("%s: %s" % (host, res.get("msg") or "the gateway check did not run"))
            continue
        hosts[host] = {"haproxy": res["haproxy"]["running"], "keepalived": res["keepalived"]["running"],
                       "vip_held": res.get("vip_held", False)}
        if not res["haproxy"]["running"]:
            problems.append("%s: HAProxy is not running" % host)
        if not res["keepalived"]["running"]:
            problems.append("%s: keepalived is not running" % host)
        for srv in res.get("servers") or []:
            inst = instance_of.get(srv["server"])
            if inst and srv["state"] != "ready":
                out.setdefault(inst, []).append("%s %s" % (host, srv["status"]))
    if hosts and not any(h["vip_held"] for h in hosts.values()):
        problems.append("no gateway host holds the floating address %s" % gw["vip"])
    front = ((probes or {}).get(GATEWAY) or {}).get("front") or {"ok": False, "detail": "not probed"}
    for inst, where in sorted(out.items()):
        problems.append("instance %s is out of rotation (%s)" % (inst, ", ".join(where)))
    if front.get("ok"):
        state = HEALTHY if not problems else DEGRADED
        took = front.get("seconds", 0)
        reason = "; ".join(problems) if problems else "a token in %.2fs through %s" % (took, gw["endpoint"])
    elif busy and front.get("timed_out") and not problems:
        # behind it the instances are busy: the token waits in their queues
        state = BUSY
        reason = "busy: %s through the floating address %s while the instances behind it are busy" % (
            front.get("detail"), gw["endpoint"])
    else:
        state = DOWN
        reason = "; ".join(["%s through the floating address %s" % (front.get("detail"), gw["endpoint"])] + problems)
    return {"state": state, "reason": reason, "problems": problems, "hosts": hosts, "out_of_rotation": out,
            "endpoint": gw["endpoint"]}


def service_status(plan, hostvars, containers, key, probes, gateway_key=None, gates=None):
    """-> {healthy, state, instances: {name: {state, reason, hosts, problems, gate}}, gateway, summary: [lines]}.

    `containers` is the plan role's npuops_containers; `key` the registered vllm_container_info result on every
    host; `probes` service_probe's probes; `gateway_key` the registered gateway_info result on every gateway host;
    `gates` gate_states (what the gates said of each instance's running configuration). An instance that answers
    while its running configuration failed a gate is wrong. With a gateway, the service is down when its floating
    address gives no token, and degraded when a gateway host lacks HAProxy or keepalived or an instance is out of
    rotation."""
    out = {}
    for name, inst in plan["instances"].items():
        problems = []
        for host, cname, _role in _containers_of(plan, containers, name):
            p = _container_problem(host, cname, results.registered(hostvars, host, key))
            if p:
                problems.append(p)
        probe = (probes or {}).get(name) or {}
        for url, res in sorted((probe.get("engines") or {}).items()):
            if not res.get("ok"):
                problems.append("%s: %s" % (url, res.get("detail")))
        front = probe.get("front") or {"ok": False, "detail": "not probed"}
        fh = probe.get("front_health") or {}
        if front.get("ok"):
            state = HEALTHY if not problems else DEGRADED
            through = "%s (%s)" % (inst["front_host"], inst["endpoint"])
            took = front.get("seconds", 0)
            reason = "; ".join(problems) if problems else "a token in %.2fs through %s" % (took, through)
        elif _busy(front, probe.get("progress")):
            # the probe's token waits in the queue behind the load while the engines step: busy, not down
            state = BUSY
            reason = "; ".join(["busy: %s; no token for the probe within its timeout" % probe["progress"]["detail"]]
                               + problems)
        else:
            state = DOWN
            why = "%s through %s (%s)" % (front.get("detail"), inst["front_host"], inst["endpoint"])
            if fh.get("ok"):
                why += " although %s answers (a wedged engine)" % fh.get("detail")
            prog = probe.get("progress") or {}
            if prog.get("ok") and prog.get("in_flight"):
                why += "; %s: no progress" % prog["detail"]
            reason = "; ".join([why] + problems)
        gate = (gates or {}).get(name)
        if gate and gate["state"] == verdict.FAILED and state != DOWN:
            # it answers, but what it answers is wrong: the gate's verdict holds until a measurement proves otherwise
            state, reason = WRONG, "; ".join(["answers wrongly: %s" % gate["detail"]] + problems)
        out[name] = {"state": state, "reason": reason, "hosts": list(inst["hosts"]), "problems": problems,
                     "endpoint": inst["endpoint"], "model": topology.instance_model(inst),
                     "gate": dict(gate) if gate else None}
        out[name].update(_images(plan, containers, hostvars, key, name))
    states = set(v["state"] for v in out.values())
    if states <= {HEALTHY, BUSY}:
        service = BUSY if BUSY in states else HEALTHY
    elif states in ({DOWN}, {WRONG}):
        service = next(iter(states))
    else:
        service = DEGRADED
    summary = ["%s: %s (%s) - %s%s%s%s" % (name, v["state"], ", ".join(v["hosts"]), v["reason"], _gate_text(v),
                                           _model_text(v), _image_text(v)) for name, v in sorted(out.items())]
    gateway = gateway_status(plan, hostvars, gateway_key, probes, busy=BUSY in states) if gateway_key else None
    if gateway:
        if gateway["state"] == DOWN:
            service = DOWN
        elif gateway["state"] == DEGRADED and service == HEALTHY:
            service = DEGRADED
        summary.append("%s: %s (%s) - %s" % (GATEWAY, gateway["state"], ", ".join(plan["gateway"]["hosts"]),
                                             gateway["reason"]))
    # busy is healthy for the exit code: requests wait, tokens come (only an instance without progress is down)
    return {"healthy": service in (HEALTHY, BUSY), "state": service, "instances": out, "gateway": gateway,
            "summary": summary}


def _busy(front, progress):
    """The token probe timed out while the instance's engines have requests in flight and step."""
    return bool(front.get("timed_out") and progress and progress.get("ok") and progress.get("progressing")
                and progress.get("in_flight"))


def status_probe_targets(plan, model):
    """The service_probe instances of the plan: each instance's front door and its serving engines, and with a
    gateway its floating address (named `gateway`); each asked for the model it serves (`model` when the plan
    names none)."""
    out = [{"name": name, "url": inst["endpoint"], "model": inst.get("served_model_name") or model,
            "health_path": inst["health_path"], "engines": [u for u in inst["api_urls"] if u != inst["endpoint"]],
            "metrics": list(inst["api_urls"])}
           for name, inst in sorted(plan["instances"].items())]
    if plan.get("gateway"):
        out.append({"name": GATEWAY, "url": plan["gateway"]["endpoint"],
                    "model": plan.get("served_model_name") or model, "health_path": "/health", "engines": []})
    return out


def unhealthy_groups(plan, status):
    """The engine groups (instance/group) of every instance that is not healthy: what recover restarts."""
    keys = []
    for name, v in sorted(status["instances"].items()):
        # a busy instance makes progress, a wrong one answers (a restart does not change what its configuration
        # answers; the rotation measures it): neither is restarted
        if v["state"] not in (HEALTHY, BUSY, WRONG):
            keys.extend(g["key"] for g in plan["instances"][name]["groups"].values())
    return keys


def rotation(hostvars, plan, key):
    """From every gateway host's gateway_info (registered under `key`): {instance: "in" | "out" | "unknown"}. An
    instance is in rotation when every server of it is ready and UP at every gateway host that answered; out when
    any is drained or in maintenance somewhere; unknown when no gateway host could be read."""
    gw = plan.get("gateway")
    if not gw:
        return {}
    instance_of = dict((server, inst) for _backend, server, inst in gateway_config.servers(gw))
    state = dict((inst, None) for inst in gw["instances"])
    for host in gw["hosts"]:
        res = results.registered(hostvars, host, key, {}) or {}
        for srv in res.get("servers") or []:
            inst = instance_of.get(srv["server"])
            if inst is None:
                continue
            ok = srv["state"] == "ready" and srv["status"].upper().startswith("UP")
            if srv["state"] != "ready":
                state[inst] = "out"
            elif state[inst] != "out":
                state[inst] = "in" if ok and state[inst] in (None, "in") else "down"
    return dict((inst, v or "unknown") for inst, v in state.items())


def gateway_repairs(status):
    """What recover repairs at the gateway: the gateway hosts whose HAProxy or keepalived is down (the gateway role
    starts them again), and whether any instance is out of rotation or wrong (the rotation decides, rotation.yml)."""
    gw = status.get("gateway") or {}
    restart = sorted(h for h, v in (gw.get("hosts") or {}).items() if not (v["haproxy"] and v["keepalived"]))
    rotation = bool(gw.get("out_of_rotation")) or any(v["state"] == WRONG for v in status["instances"].values())
    return {"restart": restart, "rotation": bool(gw) and rotation, "any": bool(restart) or (bool(gw) and rotation)}


# ------------------------------------------------------------------------------------------ may serve

def verdict_hosts(plan):
    """{instance: the host that keeps its verdicts (its first host: npuops_plan.instances[<name>].hosts[0])}."""
    return dict((name, inst["hosts"][0]) for name, inst in plan["instances"].items() if inst.get("hosts"))


def instance_configs(plan, hostvars, containers, key, instances=None):
    """{instance: {config, engines}} from vllm_container_info registered as `key` on the engine hosts: the id of the
    configuration its engines run (verdict.config_id; None when an engine is missing, not npuops', or was not read)
    and, per host, what each engine ran ({container: {exists, spec}}: what a restore puts back)."""
    out = {}
    for name in sorted(plan["instances"]) if instances is None else instances:
        specs, engines = {}, {}
        for host, cname, role in _containers_of(plan, containers, name):
            if role not in ENGINE_ROLES:
                continue
            result = results.registered(hostvars, host, key)
            found = ((result if isinstance(result, dict) else {}).get("containers") or {}).get(cname) or {}
            specs[host] = found.get("spec") if found.get("exists") and found.get("ours") else None
            engines[host] = {cname: {"exists": bool(found.get("exists")), "spec": found.get("spec")}}
        out[name] = {"config": verdict.config_id(specs), "engines": engines}
    return out


def gate_states(configs, hostvars, key, gates, plan):
    """{instance: {state, detail, config}}: what the gates said of the configuration each instance runs (`configs`:
    instance_configs), from the records instance_verdict read (registered as `key` on each instance's first host). A
    record that could not be read counts as never measured (its host is named)."""
    keepers = verdict_hosts(plan)
    out = {}
    for name, cfg in sorted(configs.items()):
        res = results.registered(hostvars, keepers.get(name), key) or {}
        record = res.get("record") if isinstance(res, dict) else None
        state, detail = verdict.gate_state(record, cfg.get("config"), gates)
        if record is None and gates and cfg.get("config"):
            why = (res.get("msg") if isinstance(res, dict) else None) or "not read"
            detail = "its verdicts on %s could not be read (%s)" % (keepers.get(name), str(why).splitlines()[0][:200])
        out[name] = {"state": state, "detail": detail, "config": cfg.get("config"),
                     "last_good": verdict.last_good(record)}
    return out


def may_serve(state, alive=True):
    """The one decision that puts an instance into rotation: it is alive and its running configuration passed every
    gate asked (verdict.gate_state)."""
    return bool(alive) and state == verdict.PASSED


def rotation_decisions(rotation, states, measure=False, alive=None):
    """What every path that touches the rotation does, instance by instance (`rotation`: gateway_rotation; `states`:
    gate_states; `alive`: {instance: bool} where known). An instance in rotation whose running configuration failed
    goes out; one out of rotation goes back when it may serve (may_serve); one out whose configuration is not proven
    (never measured, failed, unreadable) is measured first when `measure`, else stays out.
    -> {back, out, measure, kept_out: {instance: why}, lines}."""
    alive = alive or {}
    back, out, ask, kept = [], [], [], {}
    for name, where in sorted((rotation or {}).items()):
        gate = states.get(name) or {"state": verdict.UNKNOWN, "detail": "no verdict read"}
        is_alive = alive.get(name, True)
        if where == "out":
            if may_serve(gate["state"], is_alive):
                back.append(name)
            elif not is_alive:
                kept[name] = "it is down"
            elif measure:
                ask.append(name)
            else:
                kept[name] = gate["detail"]
        elif where in ("in", "down") and gate["state"] == verdict.FAILED:
            out.append(name)
            kept[name] = gate["detail"]
    lines = ["%s: back into rotation (%s)" % (n, states[n]["detail"]) for n in back]
    lines += ["%s: out of rotation: %s" % (n, kept[n]) for n in out]
    lines += ["%s: measured before it may serve (%s)" % (n, states.get(n, {}).get("detail", "")) for n in ask]
    lines += ["%s: stays out of rotation: %s" % (n, why) for n, why in sorted(kept.items()) if n not in out]
    return {"back": back, "out": out, "measure": ask, "kept_out": kept, "lines": lines, "states": dict(states),
            "wrong": _wrong(kept, states)}


def _wrong(kept, states):
    """"<instance>: why" of the instances kept out because the configuration they run failed its gate."""
    return ["%s: %s" % (n, why) for n, why in sorted(kept.items()) if (states.get(n) or {}).get("state") ==
            verdict.FAILED]


def rotation_measured(decisions, accuracy):
    """rotation_decisions after the instances it asked to measure were measured (`accuracy`: the accuracy role's
    npuops_accuracy): those that passed go back, the others stay out with the gate's words."""
    measured = decisions.get("measure") or []
    judged = (accuracy or {}).get("instances") or {}
    passed = [n for n in measured if (judged.get(n) or {}).get("ok")]
    kept = dict(decisions.get("kept_out") or {})
    lines = list(decisions.get("lines") or [])
    states = dict(decisions.get("states") or {})
    for name in measured:
        result = judged.get(name) or {}
        if name in passed:
            lines.append("%s: measured now, back into rotation (%s)" % (name, result.get("summary")))
        else:
            kept[name] = "measured now: %s" % (result.get("summary") or "not measured")
            lines.append("%s: stays out of rotation: %s" % (name, kept[name]))
        if result.get("judged") and name in states:
            states[name] = dict(states[name], state=verdict.PASSED if name in passed else verdict.FAILED,
                                detail=kept.get(name) or result.get("summary"))
    return dict(decisions, back=list(decisions.get("back") or []) + passed, kept_out=kept, lines=lines, measure=[],
                states=states, wrong=_wrong(kept, states))


def rotation_restores(decisions, plan):
    """The instances the rotation keeps out because the configuration they run failed its gate while the record holds
    another that passed (an interrupted rollout left the new one running): [{instance, groups, hosts, restore:
    {config, engines, why}}], in plan order, for the serve role's restore.yml."""
    out = []
    for name, inst in plan["instances"].items():
        state = (decisions.get("states") or {}).get(name) or {}
        good = state.get("last_good")
        if name not in (decisions.get("kept_out") or {}) or state.get("state") != verdict.FAILED:
            continue
        if not good or good["config"] == state.get("config"):
            continue
        out.append({"instance": name, "groups": [g["key"] for g in inst["groups"].values()],
                    "hosts": list(inst["hosts"]), "restore": good})
    return out


class FilterModule(object):
    def filters(self):
        return {"service_status": service_status, "status_probe_targets": status_probe_targets,
                "unhealthy_groups": unhealthy_groups, "gateway_repairs": gateway_repairs,
                "gateway_rotation": rotation, "running_images": running_images,
                "instance_configs": instance_configs, "gate_states": gate_states,
                "rotation_decisions": rotation_decisions, "rotation_measured": rotation_measured,
                "rotation_restores": rotation_restores}
