# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""service_status: the plan, what every host's containers are, and the token probes -> a verdict per instance.

healthy: every container of the instance runs (made by npuops), every serving engine answers /health, and a
token comes out of the front door. degraded: a token comes out, but something of the instance is wrong (a
container not running, an engine's /health failing, a host unreachable). down: no token comes out. The service is
healthy only when every instance is.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils.hostvars import hostvar

HEALTHY, DEGRADED, DOWN = "healthy", "degraded", "down"


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


def service_status(plan, hostvars, containers, key, probes):
    """-> {healthy, state, instances: {name: {state, reason, hosts, problems}}, summary: [lines]}.

    `containers` is the plan role's npuops_containers; `key` the registered vllm_container_info result on every
    host; `probes` service_probe's probes."""
    out = {}
    for name, inst in plan["instances"].items():
        problems = []
        for host, cname, _role in _containers_of(plan, containers, name):
            p = _container_problem(host, cname, hostvar(hostvars, host, key))
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
        else:
            state = DOWN
            why = "%s through %s (%s)" % (front.get("detail"), inst["front_host"], inst["endpoint"])
            if fh.get("ok"):
                why += " although %s answers (a wedged engine)" % fh.get("detail")
            reason = "; ".join([why] + problems)
        out[name] = {"state": state, "reason": reason, "hosts": list(inst["hosts"]), "problems": problems,
                     "endpoint": inst["endpoint"]}
    states = set(v["state"] for v in out.values())
    service = HEALTHY if states == {HEALTHY} else (DOWN if states == {DOWN} else DEGRADED)
    summary = ["%s: %s (%s) - %s" % (name, v["state"], ", ".join(v["hosts"]), v["reason"])
               for name, v in sorted(out.items())]
    return {"healthy": service == HEALTHY, "state": service, "instances": out, "summary": summary}


def status_probe_targets(plan, model):
    """The service_probe instances of the plan: each instance's front door and its serving engines."""
    return [{"name": name, "url": inst["endpoint"], "model": model, "health_path": inst["health_path"],
             "engines": [u for u in inst["api_urls"] if u != inst["endpoint"]]} for name, inst in
            sorted(plan["instances"].items())]


def unhealthy_groups(plan, status):
    """The engine groups (instance/group) of every instance that is not healthy: what recover restarts."""
    keys = []
    for name, v in sorted(status["instances"].items()):
        if v["state"] != HEALTHY:
            keys.extend(g["key"] for g in plan["instances"][name]["groups"].values())
    return keys


class FilterModule(object):
    def filters(self):
        return {"service_status": service_status, "status_probe_targets": status_probe_targets,
                "unhealthy_groups": unhealthy_groups}
