# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What site.yml hands to tools through set_stats (ansible-runner's artifact_data, key ``npuops``): where the
service is, its instances, each stage's result, and - when it failed - the stage, the hosts and why."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils.hostvars import hostvar


def site_failures(hostvars, hosts, key):
    """{task, hosts: [{host, task, msg}], msg} from what each host recorded under `key` in the rescue (only the
    hosts that failed have a record; the others stopped because of them), or None."""
    found = []
    for h in hosts:
        rec = hostvar(hostvars, h, key)
        if rec:
            found.append({"host": h, "task": rec.get("task"), "msg": rec.get("msg") or ""})
    if not found:
        return None
    return {"task": found[0]["task"], "hosts": found,
            "msg": "; ".join(f["msg"] if f["msg"].startswith(f["host"] + ":") else "%s: %s" % (f["host"], f["msg"])
                             for f in found)}


def unreachable_hosts(hostvars, hosts, key):
    """'host: why' for every host whose result under `key` says it was unreachable."""
    out = []
    for h in hosts:
        res = hostvar(hostvars, h, key) or {}
        if res.get("unreachable"):
            out.append("%s: %s" % (h, (res.get("msg") or "no answer").strip().splitlines()[-1][:200]))
    return out


def rollout_outcome(plan, model_spec, preflight=None, weights=None, validate=None, bench=None, failed=None,
                    deploy=None, monitor=None):
    """The outcome of site.yml for tools. A stage is None when it did not run (skipped by tag, or after a
    failure)."""
    plan = plan or {}
    out = {"ok": not failed, "failed": failed or None, "endpoint": plan.get("endpoint"),
           "model": (model_spec or {}).get("served_model_name"), "tier": plan.get("tier"),
           "nodes": sorted(plan.get("hosts") or []),
           "instances": dict((name, {"endpoint": inst.get("endpoint"), "hosts": inst.get("hosts")})
                             for name, inst in sorted((plan.get("instances") or {}).items())),
           "preflight": None, "weights": None, "deploy": None, "validate": None, "bench_report": None, "bench": None,
           "monitor": None}
    if preflight:
        out["preflight"] = {"ok": preflight.get("ok"), "go": preflight.get("go"),
                            "failures": [dict((k, f.get(k)) for k in ("host", "check", "device", "observed", "fix"))
                                         for f in preflight.get("failures") or []]}
    if weights:
        out["weights"] = {"seed": weights.get("seed"), "total_bytes": int(weights.get("total_bytes") or 0),
                          "files": len(weights.get("files") or []) if isinstance(weights.get("files"), list)
                          else weights.get("files"), "copied_to": list(weights.get("receivers") or [])}
    if deploy:
        out["deploy"] = {"restarted": list(deploy.get("restart") or []), "changes": list(deploy.get("lines") or [])}
    if validate:
        out["validate"] = {"ok": validate.get("ok"), "checks": validate.get("checks")}
    if bench:
        out["bench_report"] = bench.get("report")
        out["bench"] = {"ok": bench.get("ok"), "report_dir": bench.get("report_dir"), "table": bench.get("table")}
    if monitor:
        out["monitor"] = {"prometheus": list(monitor.get("prometheus_urls") or [])}
    return out


class FilterModule(object):
    def filters(self):
        return {"rollout_outcome": rollout_outcome, "site_failures": site_failures,
                "unreachable_hosts": unreachable_hosts}
