# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""diagnose_findings: what every host's diagnose_collect read -> the causes, ordered by likelihood, with the hosts,
ranks, evidence, fix and confidence (plugins/module_utils/diagnose.py does the matching over data/diagnose/: the
messages of signatures.yml and the error codes of codes.yml)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.module_utils import diagnose
from ansible_collections.npuops.ascend.plugins.plugin_utils import results

_SIGNATURES = []


def signatures():
    if not _SIGNATURES:
        try:
            _SIGNATURES.extend(diagnose.load_signatures())
        except diagnose.DiagnoseError as e:
            raise AnsibleFilterError("diagnose: %s" % e)
    return _SIGNATURES


def diagnose_findings(hostvars, hosts, key, limit=10):
    """-> {findings: [{cause, fix, evidence, host, rank, time, hosts, signature, reference, confidence, certainty,
    kind, code, source} (+ candidates for `other`, tied where causes tie, facts_host where the hosts' facts name the
    host at fault - logged_on then the host whose line is the evidence)], offsets: {host: s}, unread: [host: why],
    ascend_fd: {host: MindCluster FaultDiag's verdicts or error, where it ran}, lines: [what to print]}."""
    collected, unread = {}, []
    for h in hosts:
        r = results.registered(hostvars, h, key)
        if not isinstance(r, dict) or r.get("skipped"):
            continue
        if r.get("unreachable") or r.get("failed"):
            unread.append("%s: %s" % (h, (r.get("msg") or "no answer").splitlines()[0][:200]))
            continue
        collected[h] = r
        unread.extend("%s: %s" % (h, e) for e in r.get("errors") or [])
    findings, offsets = diagnose.diagnose_hosts(collected, signatures(), limit)
    for f in findings:
        f.pop("weight", None)
    lines = []
    for i, f in enumerate(findings, 1):
        if f.get("facts_host"):  # the host whose devices' facts show the fault, whoever logged the symptom first
            where = "on %s by its devices' facts" % f["host"]
            if f.get("logged_on"):
                where += ", first logged on %s" % f["logged_on"]
            elif f["rank"]:
                where += " rank %s" % f["rank"]
        else:
            where = "first on %s" % (f["host"] or "?") + (" rank %s" % f["rank"] if f["rank"] else "")
        others = [h for h in f["hosts"] if h not in (f["host"], f.get("logged_on"))]
        lines.append("%d. %s - %s at %s%s - confidence %.2f (%s)%s" % (
            i, f["cause"], where, f["time"] or "?", (" (also %s)" % ", ".join(others)) if others else "",
            f["confidence"], f["certainty"], (", tied with %s" % ", ".join(f["tied"])) if f.get("tied") else ""))
        lines.append("   evidence: %s" % f["evidence"][:300])
        if f.get("candidates"):
            lines.append("   nearest causes: %s" % ", ".join("%s %.2f" % (c["cause"], c["score"])
                                                             for c in f["candidates"]))
        lines.append("   fix: %s" % f["fix"])
    if not findings:
        lines.append("no error line in the logs of %s; read them with playbooks/logs.yml" % ", ".join(
            sorted(collected)) if collected else "nothing could be read")
    skewed = sorted("%s %+.1fs" % (h, o) for h, o in offsets.items() if abs(o) >= 1.0)
    if skewed:
        lines.append("clock offsets allowed for: %s" % ", ".join(skewed))
    fault_diag = dict((h, c["ascend_fd"]) for h, c in sorted(collected.items()) if c.get("ascend_fd"))
    for h, verdict in fault_diag.items():
        if verdict.get("error"):
            lines.append("ascend-fd on %s: %s" % (h, verdict["error"]))
        elif not verdict.get("verdicts"):
            lines.append("ascend-fd on %s: no fault found (NORMAL_OR_UNSUPPORTED)" % h)
        for v in verdict.get("verdicts") or []:
            lines.append("ascend-fd on %s: %s %s (%s) at %s" % (h, v["code"], v["cause"], ", ".join(v["devices"]),
                                                                v["time"] or "?"))
            lines.append("   suggestion: %s" % v["suggestion"])
    lines.extend("not read: %s" % u for u in unread)
    return {"findings": findings, "offsets": offsets, "unread": unread, "ascend_fd": fault_diag, "lines": lines}


class FilterModule(object):
    def filters(self):
        return {"diagnose_findings": diagnose_findings}
