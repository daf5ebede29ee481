"""Write docs/diagnose.md from the diagnosis' data: the signatures (data/diagnose/signatures.yml), the error-code
tables (codes.yml), the causes (causes.yml), and how well they read the corpus of real excerpts (the unit fixtures:
today's score per batch, beside the first score of the excerpts collected last, recorded once in measurement.yml).

  python tools/render_diagnose_doc.py            # rewrite docs/diagnose.md
  python tools/render_diagnose_doc.py --check    # exit 1 when docs/diagnose.md is not what the data says

The unit stage runs --check, so the document never drifts from the data.
"""
import glob
import os
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "collections"))

from ansible_collections.npuops.ascend.plugins.module_utils import diagnose  # noqa: E402

DOC = os.path.join(REPO, "docs", "diagnose.md")
CORPUS = os.path.join(REPO, "collections", "ansible_collections", "npuops", "ascend", "tests", "unit", "plugins",
                      "module_utils", "fixtures", "diagnose")
INTRO = """# Diagnose: from the logs to the cause and the fix

<!-- written by tools/render_diagnose_doc.py from data/diagnose/ (signatures.yml, codes.yml, causes.yml) and the
unit corpus: edit those, then run it -->

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

Two kinds of knowledge are matched. **Codes** (below, `## Codes`): every CANN error-code family (EExxxx, EIxxxx,
EJxxxx, EZxxxx ...), torch_npu's `ERRxxxxx`, the ACL return codes, the runtime's `rtXxx ... failed, reason=[...]`,
the HCCL return codes and Mooncake Store's error codes, each row as its reference document writes it; a code no
row names still gives its family's cause, with a lower confidence. **Messages** (`## Signatures`): what vLLM,
vllm-ascend, torch_npu and the transformers library raise at startup (memory profiling and KV-cache sizing,
architecture resolution, parser and tokenizer registration, distributed init, KV connectors, Mooncake), each
pattern with the file that raises it at the versions of `data/images.yml`, and the HCCL and driver messages.
One finding per cause keeps the line of its most specific signature or code. Each finding carries a
`confidence`, the signature's or row's weight / 100, and a `certainty`: high from 0.8, medium from 0.6,
else low. Findings are ordered by confidence, then by the earliest line - the rank that failed first - except
that a **wait** (an HCCL or store timeout: a peer did not answer) follows every cause of at least medium
confidence seen no later than it, and a **consequence** every failure prints (`EngineDeadError`, a worker dying
after another, a shutdown traceback) follows every cause. A wait its writer logs as a warning or a note (vLLM repeats
its shared-memory broadcast note while a reader compiles) is still waiting, no failure: it names its cause at low
confidence only. Findings of equal confidence are marked `tied` and shown together, highest first.

A log with an error line always gets a finding. When no cause reaches medium confidence the first finding is
`other`: the earliest failing rank's first error line (the last line of its first traceback, consequences passed
over) with the nearest causes and their scores (`candidates`: the causes whose descriptions, patterns and code
meanings share most words with that line).
Where the log alone cannot tell causes apart, the hosts' facts decide: an EI0006 with TLS switches that differ
between devices is `tls_mismatch`; with an `HCCL_SOCKET_IFNAME` that does not own `HCCL_IF_IP`, `nic_or_ip_wrong`;
with a device link down, the fix names the device. The finding then names the host whose facts show the fault (its
own line where it printed the symptom too; `logged_on` names the host that printed it first), not the first rank
that waited for it. The facts also speak by themselves: a device NIC link that `hccn_tool` reads DOWN
(`device_link_down`) and TLS switches that differ (`tls_mismatch`, on the host whose switch differs from the others)
are findings naming the host, the devices and the fix - first when the logs are quiet (a live service, nothing
failed yet), after the causes the logs name otherwise. A chip whose health is not OK is a line of `npu-smi info`,
and its fix names the card and chip.

It runs by itself when the engines of a deploy (`site.yml`, `deploy.yml`) do not come up or answer the deploy's
known question wrong (a node without `/etc/hccn.conf` starts and answers garbage) - before they are stopped
(`npuops_serve_diagnose`) - and when `status.yml` finds an instance down (`npuops_status_diagnose`). It prints per
cause the host and rank that printed it first, the other hosts, the evidence line and the fix, and hands platforms
`npuops.diagnosis` in the stats: a list of `{cause, fix, evidence, host, rank, time, hosts, signature, reference,
source, confidence, certainty}` (with `candidates` for `other`, `tied` where causes tie, `facts_host` and
`logged_on` where the hosts' facts name the host at fault). The offline command
prints `{cause, fix, evidence, host, rank, time, confidence, certainty}` per finding as JSON.

Causes: {causes}.

{cause_table}

The unit tests run the matcher on real log excerpts copied from public threads (vLLM, vllm-ascend,
Ascend/pytorch, GPUStack, Mooncake, SGLang ...: `tests/unit/plugins/module_utils/fixtures/diagnose`, each with
the thread it comes from and the cause its thread established); `## Measurement` says how well it reads them.

## Signatures
"""


def cases():
    out = []
    for manifest in sorted(glob.glob(os.path.join(CORPUS, "cases_*.yml"))):
        with open(manifest) as f:
            batch = os.path.basename(manifest)[len("cases_"):-len(".yml")]
            out.extend(dict(c, batch=c.get("batch") or batch) for c in yaml.safe_load(f) or [])
    return out


def answer(case, knowledge):
    """The top finding's cause for a corpus excerpt, and whether it is right: the thread's cause, or for an excerpt
    whose thread settled on no known cause (`other`), `other` or a low certainty."""
    with open(os.path.join(CORPUS, case["file"]), errors="replace") as f:
        found = diagnose.analyze(diagnose.lines_of(f.read(), source=case["file"]), knowledge)
    top = found[0] if found else None
    right = bool(top) and (top["cause"] == case["cause"] or (case["cause"] == "other" and top["certainty"] == "low"))
    return (top["cause"] if top else "none"), right


def first_right(got, case):
    """A recorded first answer ("cause", or "cause (low)" for a cause of low certainty) was right: the thread's cause,
    or for a thread that settled on no cause of the vocabulary, `other` or a low certainty."""
    cause = got.split()[0]
    return cause == case["cause"] or (case["cause"] == "other" and (cause == "other" or got.endswith("(low)")))


def pct(right, total):
    return "%d of %d (%.0f %%)" % (right, total, 100.0 * right / max(total, 1))


# the held-out batches: each scored once, before any signature was changed for it (measurement.yml keeps that first
# score); the acceptance of issue 41 asks 80 % of that first score
HELD_OUT = (("last", "first_score_last", "first held-out batch", "collected last, after the signatures were written"),
            ("second", "first_score_second", "second held-out batch",
             "31 new threads, collected after the first batch was scored and the signatures changed for it"),
            ("third", "first_score_third", "third held-out batch",
             "32 new threads, collected after the signatures were widened from the references"))
TARGET = 0.8


def measurement(knowledge):
    with open(os.path.join(CORPUS, "measurement.yml")) as f:
        recorded = yaml.safe_load(f)
    found = cases()
    repos = {}
    for c in found:
        repo = "/".join(c["source"].split("/")[3:5])
        repos[repo] = repos.get(repo, 0) + 1
    now = dict((c["file"], answer(c, knowledge)) for c in found)
    batches = {}
    for c in found:
        batches.setdefault(c["batch"], []).append(now[c["file"]][1])
    out = ["## Measurement\n",
           "The corpus: %d excerpts from %d threads in %d repositories (%s)." % (
               len(found), len(set(c["source"] for c in found)), len(repos),
               ", ".join("%s %d" % (r, n) for r, n in sorted(repos.items(), key=lambda x: (-x[1], x[0])))),
           "An answer is right when the first finding names the cause the thread established - for an excerpt whose "
           "thread settled on no cause of the vocabulary, when it is `other` or of low certainty.\n",
           "| batch | excerpts | right today |", "|---|---|---|"]
    labels = dict((b, "%s: %s" % (name, what)) for b, _key, name, what in HELD_OUT)
    labels.update({"hccl": "first corpus (the signatures were built from it): HCCL",
                   "mem": "first corpus: memory and devices", "runtime": "first corpus: runtime and KV transfer",
                   "software": "first corpus: software and configuration",
                   "dev": "read while the message and code signatures were written"})
    order = [b for b, _k, _n, _w in HELD_OUT]
    for b in sorted(batches, key=lambda x: (x in order, order.index(x) if x in order else 0, x == "dev", x)):
        out.append("| %s | %d | %s |" % (labels.get(b, b), len(batches[b]), pct(sum(batches[b]), len(batches[b]))))
    out.append("| all | %d | %s |\n" % (len(found), pct(sum(v[1] for v in now.values()), len(found))))
    out += ["**First scores of the held-out batches** - each scored once, with the code of the commit named, before any "
            "signature was changed for it; issue 41 asks %d %% of that first score:\n" % (TARGET * 100),
            "| held-out batch | first score | at commit | %d %% met | today |" % (TARGET * 100), "|---|---|---|---|---|"]
    by_file = dict((c["file"], c) for c in found)
    missed_tables, met, not_met = [], [], []
    for b, key, label, _what in HELD_OUT:
        first = recorded.get(key)
        if not first:
            continue
        today = batches.get(b, [])
        out.append("| %s | **%s** | %s | %s | %s |" % (
            label, pct(first["right"], first["of"]), first["commit"],
            "yes" if first["right"] >= TARGET * first["of"] else "no", pct(sum(today), len(today))))
        (met if first["right"] >= TARGET * first["of"] else not_met).append(label)
        missed = [(name, got) for name, got in first["first_answers"].items() if not first_right(got, by_file[name])]
        if len(missed) != first["of"] - first["right"]:
            raise SystemExit("measurement.yml %s: %d first answers differ from their thread's cause, but the first "
                             "score says %d of %d" % (key, len(missed), first["right"], first["of"]))
        rows = ["\nWhat the first score of the %s missed, and the answer today:\n" % label,
                "| excerpt | thread's cause | first answer | today |", "|---|---|---|---|"]
        for name, got in missed:
            c = by_file[name]
            rows.append("| [%s](%s) | %s | %s | %s |" % (name, c["source"], c["cause"], got, now[name][0]))
        missed_tables += rows
    out.append("\nMet %d %% at its first score: %s. Did not: %s. The first scores stay as recorded; \"today\" is "
               "after the signatures were changed for the batch, so it no longer measures what the diagnosis has not "
               "seen." % (TARGET * 100, ", ".join(met) or "none", ", ".join(not_met) or "none"))
    return "\n".join(out + missed_tables) + "\n"


def md(text):
    return " ".join(str(text).replace("|", "\\|").split())


def codes_section():
    with open(diagnose.CODES) as f:
        families = yaml.safe_load(f)["families"]
    out = ["## Codes\n",
           "Each family: what finds its codes in a line, its cause when no row names the code (with its weight), the "
           "source its rows come from, and its rows - the code, what the reference says it means, the cause and the "
           "weight (a row's own source where it differs).\n"]
    for fam in families:
        out.append("### `%s` - %s\n" % (fam["id"], fam.get("name") or fam["id"]))
        out.append("Matches: %s; a code no row names: %s (weight %d)\n" % (
            ", ".join("`%s`" % p.replace("`", "'") for p in fam["match"]), fam["cause"], int(fam.get("weight", 40))))
        out.append("Source: %s\n" % fam["source"])
        rows = list(fam.get("rows") or []) + [dict(r, code="%s..." % r["prefix"]) for r in fam.get("ranges") or []]
        if rows:
            out += ["| code | means | cause | weight |", "|---|---|---|---|"]
            for r in rows:
                name = " (%s)" % r["name"] if r.get("name") else ""
                own = " - source: %s" % r["source"] if r.get("source") else ""
                out.append("| `%s`%s | %s%s | %s%s | %d |" % (
                    md(r["code"]), md(name), md(r.get("means", "")), md(own), r.get("cause", fam["cause"]),
                    " (%s)" % r["kind"] if r.get("kind") else "", int(r.get("weight", 50))))
            out.append("")
    return "\n".join(out)


def render():
    with open(diagnose.SIGNATURES) as f:
        items = yaml.safe_load(f)["signatures"]
    diagnose.compile_signatures(items)  # a malformed signature fails here, naming it
    knowledge = diagnose.load_signatures()  # and a malformed code family or row, or a cause without a fix
    table = ["| cause | means |", "|---|---|"] + ["| `%s` | %s |" % (c, md(knowledge.causes[c]["means"]))
                                                  for c in diagnose.CAUSES]
    out = [INTRO.replace("{causes}", ", ".join("`%s`" % c for c in diagnose.CAUSES)).replace(
        "{cause_table}", "\n".join(table) + "\n").replace("## Signatures\n", "")]
    out.append(measurement(knowledge))
    out.append("## Signatures\n")
    by_cause = {}
    for s in items:
        by_cause.setdefault(s["cause"], []).append(s)
    for cause in diagnose.CAUSES:
        for s in by_cause.get(cause, []):
            kind = "%s, " % s["kind"] if s.get("kind", "cause") != "cause" else ""
            out.append("### `%s` - %s (%sweight %d)\n" % (s["id"], cause, kind, int(s.get("weight", 50))))
            if s.get("raised_in"):  # read by the file of the traceback's last frame
                out.append("Raised in: %s\n" % ", ".join("`%s`" % p for p in s["raised_in"]))
            out.append("Matches: %s%s\n" % (", ".join("`%s`" % p.replace("`", "'") for p in s["patterns"]),
                                            (" - unless: " + ", ".join("`%s`" % u for u in s["unless"]))
                                            if s.get("unless") else ""))
            out.append("Fix: %s\n" % " ".join(s["fix"].split()))
            out.append("Source: %s\n" % s["source"])
    out.append(codes_section())
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv):
    text = render()
    if "--check" in argv:
        with open(DOC) as f:
            if f.read() != text:
                sys.stderr.write("docs/diagnose.md is not what data/diagnose/ and the corpus say: run "
                                 "python tools/render_diagnose_doc.py\n")
                return 1
        return 0
    with open(DOC, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
