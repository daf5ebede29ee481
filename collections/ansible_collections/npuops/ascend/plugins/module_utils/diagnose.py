# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""From the logs of a failed start, a dead rank or a down instance to the cause and the fix.

Lines come from the engines' container logs, the CANN log directories (plog), npu-smi and the NPU driver's kernel
messages. Each line gets its time (whatever format the writer used), its host and, where the line shows it, its
rank. The signatures (data/diagnose/signatures.yml: a cause from CAUSES, regular expressions, the fix, the source)
are matched; a finding per cause and host keeps its earliest line. Findings are ordered by likelihood: a signature's
weight (a specific code over a consequence every failure prints), then the earliest time once each host's clock
offset is allowed for - the rank that failed first is where the cause is.

Offline on files (run from the repository root):

    PYTHONPATH=collections python -m ansible_collections.npuops.ascend.plugins.module_utils.diagnose FILE...

prints a JSON list, one object per finding: {"cause", "fix", "evidence", "host", "rank", "time"}.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import json
import os
import re
import shutil
import sys
import tempfile
import time

CAUSES = ("hccl_connect_timeout", "hccl_exec_timeout", "port_in_use", "nic_or_ip_wrong", "tls_mismatch", "rank_table",
          "npu_oom_load", "kv_cache_oom", "hccl_buffsize", "shm_too_small", "driver_cann_mismatch", "hccn_conf_missing",
          "visible_devices", "kv_transfer", "dp_master_unreachable", "version_incompatible", "parser_or_tokenizer",
          "model_path", "garbled_output", "kv_pool", "other")
SIGNATURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data",
                          "diagnose", "signatures.yml")
MAX_LINE = 2000  # a line longer than this is cut (a dumped tensor, a base64 blob)


class DiagnoseError(Exception):
    pass


# ------------------------------------------------------------------------------------------------- signatures

def load_signatures(path=SIGNATURES):
    """The signatures as data -> [{id, cause, patterns (compiled), weight, fix, source, ...}]; DiagnoseError naming
    the signature when one is malformed."""
    import yaml  # the controller's (Ansible's) PyYAML; the nodes never load signatures
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise DiagnoseError("%s: %s" % (path, e))
    return compile_signatures((doc or {}).get("signatures") or [], path)


def compile_signatures(items, where="signatures"):
    out, seen = [], set()
    for i, s in enumerate(items):
        name = s.get("id") or "#%d" % i
        if name in seen:
            raise DiagnoseError("%s: signature %s appears twice" % (where, name))
        seen.add(name)
        if s.get("cause") not in CAUSES:
            raise DiagnoseError("%s: signature %s: cause %r is not one of %s" % (where, name, s.get("cause"),
                                                                                 ", ".join(CAUSES)))
        for key in ("patterns", "fix", "source"):
            if not s.get(key):
                raise DiagnoseError("%s: signature %s has no %s" % (where, name, key))
        try:
            patterns = [re.compile(p, re.I) for p in s["patterns"]]
            unless = [re.compile(p, re.I) for p in s.get("unless") or []]
        except re.error as e:
            raise DiagnoseError("%s: signature %s: %s" % (where, name, e))
        out.append(dict(s, id=name, patterns=patterns, unless=unless, weight=int(s.get("weight", 50))))
    return out


# ------------------------------------------------------------------------------------------------- lines

MONTHS = dict((m, i) for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                            "nov", "dec"), 1))
# the formats the stack writes, most specific first; each -> (year, month, day, H, M, S, fraction)
TIMES = [
    # podman / docker logs --timestamps, ISO 8601: 2026-12-05T01:02:03.123456789Z
    (re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?"), "iso"),
    # CANN plog: [ERROR] HCCL(1234,python3):2026-12-05-01:02:03.123.456
    (re.compile(r"(\d{4})-(\d\d)-(\d\d)-(\d\d):(\d\d):(\d\d)(?:\.(\d+))?"), "plog"),
    # vLLM: INFO 12-05 01:02:03 [file.py:12] (no year)
    (re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?"), "vllm"),
    # dmesg -T: [Sat Dec  5 01:02:03 2026]
    (re.compile(r"\[\w{3} (\w{3})\s+(\d+) (\d\d):(\d\d):(\d\d) (\d{4})\]"), "dmesg"),
]


def parse_time(text, year=None):
    """The time a log line carries, as seconds since the epoch (UTC as written: logs of one cluster share a zone), or
    None. A vLLM line has no year: `year` (default this year)."""
    for rx, kind in TIMES:
        m = rx.search(text[:200])
        if not m:
            continue
        g = m.groups()
        try:
            if kind in ("iso", "plog"):
                y, mo, d, hh, mi, ss, frac = (int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), int(g[5]), g[6])
            elif kind == "vllm":
                y = year or time.gmtime().tm_year
                mo, d, hh, mi, ss, frac = int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), g[5]
            else:
                mo, d, hh, mi, ss, y, frac = MONTHS.get(g[0].lower()), int(g[1]), int(g[2]), int(g[3]), int(g[4]), \
                    int(g[5]), None
            seconds = calendar.timegm((y, mo, d, hh, mi, ss, 0, 0, 0))
        except (TypeError, ValueError, OverflowError):
            continue
        if frac:
            seconds += float("0." + frac[:6])
        if kind == "iso" and g[7] and g[7] != "Z":
            sign = 1 if g[7][0] == "+" else -1
            digits = g[7][1:].replace(":", "")
            seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)
        return seconds
    return None


RANKS = [
    re.compile(r"\((?:EngineCore|VllmWorker|Worker)[_ ]?(DP\d+(?:_TP\d+)?(?:_EP\d+)?|TP\d+|PP\d+)"),
    re.compile(r"\b(?:global_)?rank(?:Id|_id)?\s*(?:=|:|\[|\s)\s*\[?(\d+)\]?", re.I),
    re.compile(r"\bDP rank (\d+)"),
]


def parse_rank(text):
    for rx in RANKS:
        m = rx.search(text)
        if m:
            return m.group(1)
    return None


def lines_of(text, host=None, source=None, offset=0.0, year=None):
    """[{host, source, text, time, rank}] of one log text; `offset` (seconds this host's clock is ahead) is taken
    off every time. A line without its own time gets the last time seen before it."""
    out, last = [], None
    for raw in (text or "").splitlines():
        line = raw.rstrip()[:MAX_LINE]
        if not line.strip():
            continue
        t = parse_time(line, year)
        if t is not None:
            last = t - offset
        out.append({"host": host, "source": source, "text": line, "time": last if t is None else t - offset,
                    "rank": parse_rank(line)})
    return out


# ------------------------------------------------------------------------------------------------- matching

def iso(seconds):
    if seconds is None:
        return None
    ms = int(round(seconds * 1000))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + ".%03dZ" % (ms % 1000)


def match(lines, signatures):
    """-> [(signature, line)] for every line a signature matches (its `unless` patterns not matching the line)."""
    hits = []
    for line in lines:
        text = line["text"]
        for s in signatures:
            if any(p.search(text) for p in s["patterns"]) and not any(u.search(text) for u in s["unless"]):
                hits.append((s, line))
    return hits


def refine(cause, fix, host, facts):
    """A cause the log alone cannot tell apart, told apart by the hosts' facts (what preflight reads: the TLS switch
    of every device, which interface owns HCCL_IF_IP, each device's link): -> (cause, fix)."""
    if cause != "hccl_connect_timeout" or not facts:
        return cause, fix
    tls = dict((h, f["tls"]) for h, f in facts.items() if isinstance(f.get("tls"), dict) and f["tls"])
    if len(set(str(v) for states in tls.values() for v in states.values())) > 1:
        differing = ["%s %s" % (h, _tls_text(tls[h])) for h in sorted(tls)]
        return "tls_mismatch", ("the TLS switch differs between devices (%s): set one value on every device of every "
                                "node (hccn_tool -i <dev> -tls -s enable 0 or 1) and start again" % "; ".join(differing))
    for h, f in sorted(facts.items()):
        if f.get("if_ip") and f.get("socket_ifname") and f["if_ip"] not in (f.get("addresses") or {}).get(
                f["socket_ifname"], []):
            return "nic_or_ip_wrong", ("%s: HCCL_SOCKET_IFNAME=%s does not own HCCL_IF_IP=%s: set npuops_nic to the "
                                       "interface that holds the node's address" % (h, f["socket_ifname"], f["if_ip"]))
    for h, f in sorted(facts.items()):
        down = sorted(int(d) for d, state in (f.get("links") or {}).items() if str(state).upper() != "UP")
        if down:
            return cause, ("%s: device NIC link down on NPU %s (hccn_tool -i <dev> -link -g): fix the cable or optics, "
                           "then start again; %s" % (h, ", ".join(str(d) for d in down), fix))
    return cause, fix


def _tls_text(states):
    """{device: 0/1} -> 'tls 0,0,1,...' in device order."""
    return "tls " + ",".join(str(states[d]) for d in sorted(states, key=lambda x: int(x) if str(x).isdigit() else 0))


def analyze(lines, signatures, facts=None, limit=20):
    """Lines (lines_of) -> findings ordered by likelihood: [{cause, fix, evidence, host, rank, time, signature,
    source, hosts}]. One finding per cause; its evidence is the earliest line of the most specific signature, and
    `hosts` every host that printed it, first failing first."""
    by_cause = {}
    for s, line in match(lines, signatures):
        key = s["cause"]
        entry = by_cause.setdefault(key, {"weight": s["weight"], "sig": s, "line": line, "hosts": {}})
        t = line["time"] if line["time"] is not None else float("inf")
        if line["host"] is not None:
            entry["hosts"][line["host"]] = min(entry["hosts"].get(line["host"], float("inf")), t)
        best_t = entry["line"]["time"] if entry["line"]["time"] is not None else float("inf")
        if s["weight"] > entry["weight"] or (s["weight"] == entry["weight"] and t < best_t):
            entry.update(weight=s["weight"], sig=s, line=line)
    findings = []
    for cause, e in by_cause.items():
        s, line = e["sig"], e["line"]
        fixed_cause, fix = refine(cause, s["fix"], line["host"], facts)
        findings.append({"cause": fixed_cause, "fix": fix, "evidence": line["text"].strip(), "host": line["host"],
                         "rank": line["rank"], "time": iso(line["time"]), "signature": s["id"],
                         "source": line["source"], "reference": s["source"], "weight": e["weight"],
                         "hosts": [h for h, _t in sorted(e["hosts"].items(), key=lambda x: (x[1], x[0]))],
                         "_t": line["time"] if line["time"] is not None else float("inf")})
    findings.sort(key=lambda f: (-f["weight"], f["_t"]))
    for f in findings:
        del f["_t"]
    return findings[:limit]


def clock_offsets(clocks):
    """{host: its clock read at about the same moment} -> {host: seconds ahead of the median clock}."""
    values = sorted(v for v in clocks.values() if v is not None)
    if not values:
        return {}
    mid = values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
    return dict((h, (v - mid) if v is not None else 0.0) for h, v in clocks.items())


# ------------------------------------------------------------------------------------------------- on a node

KERNEL = re.compile(r"davinci|npu|drv|hccp|hns|ascend|devmm|tsdrv|hdc|svm|out of memory|oom-kill", re.I)
CONTAINER_ENV = ("HCCL_IF_IP", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "ASCEND_RT_VISIBLE_DEVICES", "VLLM_HOST_IP")


def read_tail(path, max_bytes):
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        return f.read().decode("utf-8", "replace")


def log_files(dirs, newer_than, max_files=64, walk=os.walk, getmtime=os.path.getmtime):
    """The *.log files under `dirs` (CANN's plog and device logs) written to since `newer_than`, newest first."""
    found = []
    for d in dirs or []:
        for root, _dirs, names in walk(d):
            for name in names:
                if not name.endswith(".log"):
                    continue
                path = os.path.join(root, name)
                try:
                    mtime = getmtime(path)
                except OSError:
                    continue
                if mtime >= newer_than:
                    found.append((mtime, path))
    return [p for _m, p in sorted(found, reverse=True)[:max_files]]


def chip_health_lines(text):
    """``npu-smi info`` -> one line per chip whose health is not OK (what the signatures read), [] when all are."""
    from ansible_collections.npuops.ascend.plugins.module_utils import npu_smi  # node side only
    try:
        chips = npu_smi.parse_info(text)["chips"]
    except (npu_smi.NpuSmiError, ValueError, IndexError):  # a driver that answers garbage says so elsewhere
        return []
    row = "npu-smi info: NPU %s chip %s (phy %s) health %s"
    return [row % (c["card"], c["chip"], c.get("table_phy_id"), c["health"])
            for c in chips if (c.get("health") or "UNKNOWN") != "OK"]


def ascend_fd_verdict(report):
    """MindCluster FaultDiag's report (``fault_diag_result/diag_report.json`` of ``ascend-fd single-diag``; fields as
    Ascend/mind-cluster docs/zh/faultdiag/ascend-faultdiag/06_api/03_command_diag.md describes them) -> one verdict
    per fault event: [{code, cause, suggestion, devices, evidence, time}], earliest first."""
    faults = ((report or {}).get("Knowledge_Graph") or {}).get("fault") or []
    out = []
    for fault in faults:
        if not isinstance(fault, dict):
            continue
        events = [e for evs in (fault.get("event_attr") or {}).values() for e in (evs or []) if isinstance(e, dict)]
        first = min(events, key=lambda e: str(e.get("occur_time") or "")) if events else {}
        out.append({"code": fault.get("code"), "cause": fault.get("cause_zh") or fault.get("cause_en"),
                    "suggestion": " ".join(str(x) for x in fault.get("suggestion_zh") or fault.get("suggestion_en")
                                           or []),
                    "devices": [str(d) for d in fault.get("fault_source") or []],
                    "evidence": first.get("key_info"), "time": first.get("occur_time")})
    return sorted(out, key=lambda v: str(v["time"] or "~"))


def run_ascend_fd(ascend_fd, texts, log_dirs, bounded):
    """ascend-fd single-diag on this node's CANN logs (--process_log) and the engines' logs (--train_log, written to
    a directory of its own): -> {verdicts: [...]} or {error}. `bounded(argv)` runs within the budget."""
    work = tempfile.mkdtemp(prefix="npuops-ascend-fd-")
    try:
        train = os.path.join(work, "train_log")
        os.mkdir(train)
        for i, text in enumerate(texts):
            with open(os.path.join(train, "engine-%d.log" % i), "w") as f:
                f.write(text)
        argv = [ascend_fd, "single-diag", "-o", os.path.join(work, "out"), "--train_log", train]
        process = [d for d in log_dirs if os.path.isdir(d)]
        if process:
            argv += ["--process_log", process[0]]
        rc, text = bounded(argv)
        if rc is None:
            return {"error": "budget spent before ascend-fd ran"}
        report = os.path.join(work, "out", "fault_diag_result", "diag_report.json")
        if not os.path.exists(report):
            return {"error": "ascend-fd single-diag exited %s without a report: %s" % (
                rc, (text.strip().splitlines() or [""])[-1][:300])}
        with open(report) as f:
            return {"verdicts": ascend_fd_verdict(json.load(f))}
    except (OSError, ValueError) as e:
        return {"error": "ascend-fd: %s" % e}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def collect(engine, names, run, tail=3000, log_dirs=(), hccn_tool=None, devices=(), budget=40.0, clock=time.time,
            max_bytes=512 * 1024, npu_smi=None, ascend_fd=None):
    """What a node says about a failure, each call bounded and all within `budget` seconds: -> {clock, sources:
    [{source, text}], facts: {env, addresses, tls, links}, errors}.

    `engine` a container.Engine, `names` the service's containers (their log since their last start, each line with
    its time), `log_dirs` the CANN log directories the containers write to on the host (files written since the
    earliest start), the NPU driver's kernel messages, and the facts diagnose tells causes apart with: the
    containers' network variables, the node's addresses, every device's TLS switch and link (hccn_tool), the
    chips' health (`npu_smi`), and MindCluster FaultDiag's verdict when `ascend_fd` (its CLI) is installed."""
    from ansible_collections.npuops.ascend.plugins.module_utils import hccn, host  # node side only
    deadline = clock() + budget
    out = {"clock": clock(), "sources": [], "facts": {"env": {}, "addresses": {}, "tls": {}, "links": {}},
           "errors": []}
    starts = []
    for name in names:
        try:
            info = engine.inspect(name)
        except Exception as e:  # a wedged daemon: say so, read the rest
            out["errors"].append("%s: %s" % (name, e))
            continue
        if not info:
            continue
        st = engine.state(info)
        env = dict(e.split("=", 1) for e in ((info.get("Config") or {}).get("Env") or []) if "=" in e)
        out["facts"]["env"][name] = dict((k, env[k]) for k in CONTAINER_ENV if k in env)
        started = parse_time(st.get("started_at") or "")
        if started:
            starts.append(started)
        text = engine.logs(name, tail=tail, since=st.get("started_at"), timestamps=True)
        ended = (info.get("State") or {}).get("FinishedAt")
        if not st["running"] and ended and not str(ended).startswith("0001"):
            # how it ended, in the log's own format: a rank killed (137) or crashed says so nowhere else
            text += "\n%s container %s exited with exit code %s" % (ended, name, st.get("exit_code"))
        out["sources"].append({"source": "container %s" % name, "text": text})
    since = (min(starts) - 60) if starts else clock() - 3600
    for path in log_files(log_dirs, since):
        if clock() > deadline:
            out["errors"].append("budget spent before reading %s" % path)
            break
        try:
            out["sources"].append({"source": path, "text": read_tail(path, max_bytes)})
        except OSError as e:
            out["errors"].append("%s: %s" % (path, e))

    def bounded(argv, cap=10.0):
        left = deadline - clock()
        if left <= 0:
            return None, ""
        rc, stdout, stderr = run(argv, min(left, cap))
        return rc, stdout + stderr

    rc, text = bounded(["env", "TZ=UTC", "dmesg", "-T", "--level=emerg,alert,crit,err,warn"])
    if rc == 0:  # the NPU driver's messages since the service's start (older ones belong to other stories)
        kernel = [line for line in text.splitlines()
                  if KERNEL.search(line) and (parse_time(line) or 0) >= since][-300:]
        if kernel:
            out["sources"].append({"source": "dmesg", "text": "\n".join(kernel)})
    if npu_smi:
        rc, text = bounded([npu_smi, "info"])
        unhealthy = chip_health_lines(text) if rc == 0 else []
        if unhealthy:  # now, not since the start: npu-smi has no history
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(clock()))
            out["sources"].append({"source": "npu-smi", "text": "\n".join("%s %s" % (stamp, u) for u in unhealthy)})
    nics = host.ipv4_addresses(lambda argv: run(argv, max(1, min(deadline - clock(), 10)))[:2])
    out["facts"]["addresses"] = nics or {}
    for dev in devices if hccn_tool else ():
        rc, text = bounded([hccn_tool, "-i", str(dev), "-tls", "-g"])
        if rc is None:
            out["errors"].append("budget spent before reading the devices' TLS and link")
            break
        out["facts"]["tls"][str(dev)] = hccn.parse_tls(text)
        rc, text = bounded([hccn_tool, "-i", str(dev), "-link", "-g"])
        out["facts"]["links"][str(dev)] = hccn.parse_link(text)
    if ascend_fd:  # last: it may take what is left of the budget
        engine_logs = [s["text"] for s in out["sources"] if s["source"].startswith("container ")]
        out["ascend_fd"] = run_ascend_fd(ascend_fd, engine_logs, log_dirs, lambda argv: bounded(argv, cap=budget))
    return out


def host_facts(collected):
    """What refine() reads of one host's collect(): tls, links, addresses, if_ip and socket_ifname of its engine."""
    facts = collected.get("facts") or {}
    env = {}
    for values in (facts.get("env") or {}).values():
        env.update(values)
    tls = dict((d, v) for d, v in (facts.get("tls") or {}).items() if v is not None)
    return {"tls": tls, "links": dict((d, v) for d, v in (facts.get("links") or {}).items() if v is not None),
            "addresses": facts.get("addresses") or {}, "if_ip": env.get("HCCL_IF_IP"),
            "socket_ifname": env.get("HCCL_SOCKET_IFNAME")}


def diagnose_hosts(collected, signatures, limit=20):
    """{host: collect()} -> findings over every host, each host's clock offset (against the others', read at about
    the same moment) taken off its lines."""
    offsets = clock_offsets(dict((h, c.get("clock")) for h, c in collected.items()))
    lines = []
    for h, c in sorted(collected.items()):
        for src in c.get("sources") or []:
            lines += lines_of(src.get("text"), host=h, source=src.get("source"), offset=offsets.get(h, 0.0))
    facts = dict((h, host_facts(c)) for h, c in collected.items())
    return analyze(lines, signatures, facts, limit), offsets


def brief(findings):
    """What the offline CLI prints per finding."""
    return [dict((k, f.get(k)) for k in ("cause", "fix", "evidence", "host", "rank", "time")) for f in findings]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 2
    try:
        signatures = load_signatures()
    except DiagnoseError as e:
        sys.stderr.write("diagnose: %s\n" % e)
        return 2
    lines = []
    for path in argv:
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError as e:
            sys.stderr.write("diagnose: %s: %s\n" % (path, e))
            return 2
        lines += lines_of(text, host=None, source=path)
    sys.stdout.write(json.dumps(brief(analyze(lines, signatures)), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
