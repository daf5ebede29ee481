# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gates' verdicts, per instance and per configuration, kept on the instance's first host.

A configuration is what the instance's engines run: the specs their containers carry (``io.npuops.spec``, secrets
left out: a new API key changes no answer), hashed together with the hosts they run on (``config_id``). The record
of an instance (one JSON file) holds, per configuration, the verdict of each gate that judged it (``answers``: the
accuracy gate; ``speed``: the rollout's speed gate) and, for the last configuration that passed, what its engines
ran, so that a configuration that fails can be replaced by the last one known to answer right.

A verdict lasts until another measurement of the same configuration replaces it. Standard library only: the
record is read and written on the nodes (module ``instance_verdict``) and judged on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import hashlib
import json
import os

from ansible_collections.npuops.ascend.plugins.module_utils import files

DIRECTORY = "/var/lib/npuops/verdicts"
GATES = ("answers", "speed")
PASSED = "passed"
FAILED = "failed"
UNMEASURED = "not measured"
UNKNOWN = "unknown"  # the configuration itself could not be read (an engine missing, not npuops')
# configurations whose verdicts a record keeps (the newest); older ones are measured again if they come back
KEEP = 8


class VerdictError(Exception):
    pass


def config_id(engines):
    """{host: the public spec of its engine (vllm_container_info's ``spec``)} -> the configuration's id, or None when
    an engine has no spec (not npuops', or missing)."""
    if not engines:
        return None
    canonical = []
    for host in sorted(engines):
        spec = engines[host]
        if not spec or not spec.get("command"):
            return None
        canonical.append([host, dict((k, v) for k, v in sorted(spec.items()) if k != "secret_env")])
    return "cfg-" + hashlib.sha256(json.dumps(canonical, sort_keys=True).encode("utf-8")).hexdigest()[:20]


def empty(instance):
    return {"instance": instance, "configs": {}, "order": [], "last_good": None}


def record(doc, instance, config, gate, verdict, detail="", at="", engines=None):
    """The record `doc` with `gate`'s `verdict` on `config`; a pass with `engines` ({host: {container: entry}})
    keeps them as the last good configuration, a failure of that configuration forgets it. -> a new dict.

    The same verdict with the same detail given again keeps the time it was first given (`at` says since when it
    holds): a re-run on an unchanged cluster leaves the record as it was."""
    if gate not in GATES:
        raise VerdictError("gate %r is not one of %s" % (gate, ", ".join(GATES)))
    if verdict not in (PASSED, FAILED):
        raise VerdictError("verdict %r is neither %s nor %s" % (verdict, PASSED, FAILED))
    if not config:
        raise VerdictError("no configuration to record the verdict of")
    out = empty(instance)
    out.update((k, v) for k, v in (doc or {}).items() if k in out)
    configs = dict(out["configs"])
    configs[config] = dict(configs.get(config) or {})
    prior = configs[config].get(gate) or {}
    given = prior.get("at") if (prior.get("verdict"), prior.get("detail")) == (verdict, detail) else at
    configs[config][gate] = {"verdict": verdict, "at": given, "detail": detail}
    order = [c for c in out["order"] if c != config] + [config]
    for old in order[:-KEEP]:
        configs.pop(old, None)
    out.update(instance=instance, configs=configs, order=order[-KEEP:])
    good = out.get("last_good") or None
    if verdict == PASSED and engines:
        if all((configs[config].get(g) or {}).get("verdict") != FAILED for g in GATES):
            same = good and good.get("config") == config and good.get("engines") == engines
            out["last_good"] = {"config": config, "engines": engines, "at": good.get("at") if same else at}
    elif verdict == FAILED and good and good.get("config") == config:
        out["last_good"] = None
    return out


def gate_state(doc, config, gates):
    """-> (state, detail) of a configuration under the gates asked: PASSED when every gate passed it (or none is
    asked), FAILED when one failed, UNMEASURED when one never judged it, UNKNOWN when the configuration could not be
    read."""
    if not gates:
        return PASSED, "no gate asked"
    if not config:
        return UNKNOWN, "its running configuration could not be read"
    judged = ((doc or {}).get("configs") or {}).get(config) or {}
    details = []
    for gate in gates:
        entry = judged.get(gate)
        if not entry:
            return UNMEASURED, "its running configuration (%s) was never measured by the %s gate" % (config, gate)
        if entry.get("verdict") != PASSED:
            return FAILED, "its running configuration (%s) failed the %s gate at %s: %s" % (
                config, gate, entry.get("at") or "?", entry.get("detail") or "no detail")
        details.append("%s passed at %s" % (gate, entry.get("at") or "?"))
    return PASSED, "; ".join(details)


def last_good(doc):
    """{config, engines, why} of the last configuration of the record that passed its gates, or None."""
    good = (doc or {}).get("last_good") or {}
    if not good.get("engines"):
        return None
    return {"config": good.get("config"), "engines": good["engines"],
            "why": "the last configuration that passed its gates (%s, at %s)" % (
                good.get("config"), good.get("at") or "?")}


def path_of(directory, instance):
    if not instance or "/" in instance or instance.startswith("."):
        raise VerdictError("instance name %r cannot name a record file" % (instance,))
    return os.path.join(directory, instance + ".json")


def load(path, instance):
    """The record at `path` (an empty one when there is none). A record that cannot be parsed is an error: it is not
    silently forgotten (its verdicts would then read as never measured)."""
    try:
        with open(path) as f:
            text = f.read()
    except (IOError, OSError) as e:
        if e.errno == errno.ENOENT:
            return empty(instance)
        raise VerdictError("cannot read %s: %s" % (path, e))
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise VerdictError("%s is not a verdict record (%s): remove it to measure the instance again" % (path, e))
    if not isinstance(doc, dict) or not isinstance(doc.get("configs", {}), dict):
        raise VerdictError("%s is not a verdict record: remove it to measure the instance again" % path)
    out = empty(instance)
    out.update((k, v) for k, v in doc.items() if k in out)
    return out


def save(path, doc):
    """Write the record atomically (a reader sees the old or the new one, never half of one); root only."""
    files.write_atomic(path, json.dumps(doc, sort_keys=True))
