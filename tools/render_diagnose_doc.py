"""Write docs/diagnose.md from the signatures (data/diagnose/signatures.yml).

  python tools/render_diagnose_doc.py            # rewrite docs/diagnose.md
  python tools/render_diagnose_doc.py --check    # exit 1 when docs/diagnose.md is not what the data says

The unit stage runs --check, so the document never drifts from the data.
"""
import os
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "collections"))

from ansible_collections.npuops.ascend.plugins.module_utils import diagnose  # noqa: E402

DOC = os.path.join(REPO, "docs", "diagnose.md")
INTRO = """# Diagnose: from the logs to the cause and the fix

<!-- written by tools/render_diagnose_doc.py from data/diagnose/signatures.yml: edit those, then run it -->

```sh
ansible-playbook -i inventories/<cluster> playbooks/diagnose.yml
# offline, on log files (run from the repository root):
PYTHONPATH=collections python -m ansible_collections.npuops.ascend.plugins.module_utils.diagnose node01.log node02.log
```

On every host of the plan at once, each within `npuops_diagnose_budget` seconds (40) whatever is broken, the
`diagnose` role reads (module `diagnose_collect`) the service containers' logs since their last start, each line with
the time the engine wrote it (`logs --timestamps`); the CANN log files (plog, device logs) under
`npuops_diagnose_log_dirs` written since then; the NPU driver's kernel messages (`dmesg`); every device's TLS switch
and link (`hccn_tool`), the containers' `HCCL_IF_IP` / `HCCL_SOCKET_IFNAME` and the node's addresses; every chip
whose health in `npu-smi info` is not OK; and the node's clock. Where MindCluster FaultDiag (`ascend-fd`) is
installed on a node (`npuops_diagnose_ascend_fd`: `auto` finds it on `PATH`), it also runs `ascend-fd single-diag`
on the CANN logs and the engines' logs within what is left of the budget, and its verdict - each fault event's code,
cause, suggestion, devices and key log line, read from `fault_diag_result/diag_report.json` - is printed after the
findings and handed to platforms as `npuops.diagnosis_ascend_fd` ({host: {verdicts} or {error}}). On the controller every line gets its time whatever format wrote it (RFC 3339, vLLM's `INFO 12-05 01:02:03`,
CANN's `2026-12-05-01:02:03.123.456`, `dmesg -T`), less the node's clock offset against the others (read at the same
moment), and its rank where the line shows one (`EngineCore_DP2`, `rank=3`, `rankId[12]`).

The signatures below are matched; one finding per cause keeps the line of its most specific signature, and the
findings are ordered by likelihood: the signature's weight first (a code or phrase only one cause prints outranks a
consequence every failure prints, such as `EngineDeadError`), then the earliest line - the rank that failed first.
Where the log alone cannot tell causes apart, the hosts' facts decide: an EI0006 with TLS switches that differ
between devices is `tls_mismatch`; with an `HCCL_SOCKET_IFNAME` that does not own `HCCL_IF_IP`, `nic_or_ip_wrong`;
with a device link down, the fix names the device.

It runs by itself when the engines of a deploy (`site.yml`, `deploy.yml`) do not come up or answer the deploy's
known question wrong (a node without `/etc/hccn.conf` starts and answers garbage) - before they are stopped
(`npuops_serve_diagnose`) - and when `status.yml` finds an instance down (`npuops_status_diagnose`). It prints per
cause the host and rank that printed it first, the other hosts, the evidence line and the fix, and hands platforms
`npuops.diagnosis` in the stats: a list of `{cause, fix, evidence, host, rank, time, hosts, signature, reference,
source}`. The offline command prints `{cause, fix, evidence, host, rank, time}` per finding as JSON.

Causes: {causes}.

The unit tests run the matcher on real log excerpts copied from public vLLM and vLLM-Ascend issues
(`tests/unit/plugins/module_utils/fixtures/diagnose`, each with the issue it comes from and the cause its thread
established).

## Signatures
"""


def render():
    with open(diagnose.SIGNATURES) as f:
        items = yaml.safe_load(f)["signatures"]
    diagnose.compile_signatures(items)  # a malformed signature fails here, naming it
    out = [INTRO.replace("{causes}", ", ".join("`%s`" % c for c in diagnose.CAUSES))]
    by_cause = {}
    for s in items:
        by_cause.setdefault(s["cause"], []).append(s)
    for cause in diagnose.CAUSES:
        for s in by_cause.get(cause, []):
            out.append("### `%s` - %s (weight %d)\n" % (s["id"], cause, int(s.get("weight", 50))))
            out.append("Matches: %s%s\n" % (", ".join("`%s`" % p.replace("`", "'") for p in s["patterns"]),
                                            (" - unless: " + ", ".join("`%s`" % u for u in s["unless"]))
                                            if s.get("unless") else ""))
            out.append("Fix: %s\n" % " ".join(s["fix"].split()))
            out.append("Source: %s\n" % s["source"])
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv):
    text = render()
    if "--check" in argv:
        with open(DOC) as f:
            if f.read() != text:
                sys.stderr.write("docs/diagnose.md is not what data/diagnose/signatures.yml says: run "
                                 "python tools/render_diagnose_doc.py\n")
                return 1
        return 0
    with open(DOC, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
