# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One way to read how a host's registered result ended, for every stage's all-or-nothing gate.

The stages register their per-host steps with ``failed_when: false`` / ``ignore_errors`` and ``ignore_unreachable``
so that one host's failure does not hide the others'; then one place tells, per host: it failed (the cause), it was
unreachable (a cause too), it only stopped because another host failed (an echo: named after the causes, never
instead of them), it was skipped, or it went fine."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils.model.hostvars import hostvar as _host_value

OK, SKIPPED, UNREACHABLE, FAILED, STOPPED = "ok", "skipped", "unreachable", "failed", "stopped"


def registered(hostvars, host, key, default=None):
    """What a stage's task registered as `key` on `host` (or `default`): a result of the run, not the inventory,
    which only the model reads (plugin_utils/model)."""
    return _host_value(hostvars, host, key, default)


def outcome(res, done_key=None):
    """(kind, message) of one registered result. `done_key`: a key every successful result carries, for steps
    registered with ``failed_when: false`` (which clears ``failed``): a result with a message and without that key
    failed. A result marked ``aborted`` or in state ``stopped`` ended because another host failed."""
    if not isinstance(res, dict) or res.get("skipped"):
        return SKIPPED, None
    msg = str(res.get("msg") or "").strip()
    if res.get("unreachable"):
        return UNREACHABLE, "unreachable (%s)" % ((msg or "no answer").splitlines() or ["no answer"])[0][:300]
    failed = bool(res.get("failed")) or (done_key is not None and bool(msg) and done_key not in res)
    if not failed and not (res.get("aborted") and msg):
        return OK, None
    if res.get("aborted") or res.get("state") == "stopped":
        return STOPPED, msg[:1000] or "stopped"
    return FAILED, msg[:1000] or "failed"


def classify(hostvars, hosts, key, done_key=None):
    """{"causes": {host: message}, "echoes": {host: message}} of the hosts whose result under `key` failed or was
    unreachable (causes) or stopped because of them (echoes), in the order of `hosts`."""
    causes, echoes = {}, {}
    for h in hosts:
        kind, msg = outcome(registered(hostvars, h, key), done_key)
        if kind in (FAILED, UNREACHABLE):
            causes[h] = msg
        elif kind == STOPPED:
            echoes[h] = msg
    return {"causes": causes, "echoes": echoes}


def gate(hostvars, hosts, key, stage, step, undone, done_key=None):
    """The all-or-nothing verdict of one step of a stage: {"hosts": the hosts that failed (the causes; the echoes
    when no cause is known), "message": one message naming each of them and why, then the hosts that only stopped
    because of them}. `undone` says what was undone on every reachable host. No failure: no hosts, no message."""
    found = classify(hostvars, hosts, key, done_key)
    named = found["causes"] or found["echoes"]
    if not named:
        return {"hosts": [], "message": ""}
    lines = ["%s failed (%s) on %d host(s); %s:" % (stage, step, len(named), undone)]
    lines += ["- %s: %s" % kv for kv in named.items()]
    lines += ["- %s: %s" % kv for kv in found["echoes"].items() if kv[0] not in named]
    return {"hosts": list(named), "message": "\n".join(lines)}
