# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What site.yml hands to tools through set_stats (ansible-runner's artifact_data, key ``npuops``): where the
service is, its instances, each stage's result, and - when it failed - the stage, the hosts and why."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils.model import topology
from ansible_collections.npuops.ascend.plugins.plugin_utils import results


def site_failures(hostvars, hosts, key):
    """{task, hosts: [{host, task, msg}], msg} from what each host recorded under `key` in the rescue (only the
    hosts that failed have a record; the others stopped because of them), or None."""
    found = []
    for h in hosts:
        rec = results.registered(hostvars, h, key)
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
        kind, _msg = results.outcome(results.registered(hostvars, h, key))
        if kind == results.UNREACHABLE:
            out.append("%s: %s" % (h, (str(results.registered(hostvars, h, key).get("msg") or "no answer")).strip()
                                   .splitlines()[-1][:200]))
    return out


def _preflight(p):
    return {"ok": p.get("ok"), "go": p.get("go"),
            "failures": [dict((k, f.get(k)) for k in ("host", "check", "device", "observed", "fix"))
                         for f in p.get("failures") or []]}


def images_of(preflight):
    """{host: {image, id, digest, versions}}: what preflight read from each engine image on its node."""
    return dict((h, dict((k, i.get(k)) for k in ("image", "id", "digest", "versions")))
                for h, i in sorted(((preflight or {}).get("images") or {}).items()) if i.get("present"))


def _weights(w):
    out = {"seed": w.get("seed"), "total_bytes": int(w.get("total_bytes") or 0),
           "files": len(w.get("files") or []) if isinstance(w.get("files"), list) else w.get("files"),
           "copied_to": list(w.get("receivers") or [])}
    if w.get("tokenizer"):  # the tokenizer directory, copied after the weights when it lies outside them
        out["tokenizer"] = dict(_weights(w["tokenizer"]), dir=w["tokenizer"].get("dir"), seed=w.get("seed"))
    if w.get("sets"):  # replicas on different weights: each set, copied to its own instances' nodes
        out["sets"] = [dict(_weights(dict(one, sets=None)), dir=one.get("dir"), instances=one.get("instances"))
                       for one in w["sets"]]
    return out


# each stage's part of the outcome, from what its role left (None: the stage did not run - skipped by tag, or after
# a failure)
STAGES = {
    "preflight": _preflight,
    "weights": _weights,
    "deploy": lambda d: {"restarted": list(d.get("restart") or []), "changes": list(d.get("lines") or [])},
    "validate": lambda v: {"ok": v.get("ok"), "checks": v.get("checks")},
    "accuracy": lambda a: {"ok": a.get("ok"), "instances": a.get("instances"), "failures": a.get("failures")},
    "bench": lambda b: {"ok": b.get("ok"), "report_dir": b.get("report_dir"), "table": b.get("table")},
    "monitor": lambda m: {"prometheus": list(m.get("prometheus_urls") or [])},
}


def rollout_outcome(plan, model_spec, stages=None):
    """The outcome of site.yml for tools: the plan's endpoint, model, tier, recipe, nodes and instances, what each
    node's image holds (read by preflight), every stage's result (`stages`: {stage: what its role left, or None},
    `failed`: site_failures' answer, or None, and `recipe`: the recipe's name)."""
    plan, stages = plan or {}, stages or {}
    failed = stages.get("failed")
    out = {"ok": not failed, "failed": failed or None, "endpoint": plan.get("endpoint"),
           "model": plan.get("served_model_name") or (model_spec or {}).get("served_model_name"),
           "tier": plan.get("tier"),
           "nodes": sorted(plan.get("hosts") or []),
           "instances": dict((name, {"endpoint": inst.get("endpoint"), "hosts": inst.get("hosts"),
                                     "model": topology.instance_model(inst)})
                             for name, inst in sorted((plan.get("instances") or {}).items())),
           "recipe": stages.get("recipe"), "images": images_of(stages.get("preflight")),
           "bench_report": (stages.get("bench") or {}).get("report")}
    for name, summary in STAGES.items():
        out[name] = summary(stages[name]) if stages.get(name) else None
    return out


class FilterModule(object):
    def filters(self):
        return {"rollout_outcome": rollout_outcome, "site_failures": site_failures,
                "unreachable_hosts": unreachable_hosts}
