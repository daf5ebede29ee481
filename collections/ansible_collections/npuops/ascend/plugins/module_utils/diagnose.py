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
          "model_path", "model_unsupported", "config_invalid", "garbled_output", "kv_pool", "operator_error",
          "npu_device_fault", "device_link_down", "host_oom", "other")
# what a line is to the failure: its cause, a wait on a peer that failed (an HCCL or store timeout: it names a cause only
# when nothing failed before it), or a consequence every failure prints (a worker dying after another, a shutdown)
KINDS = ("cause", "wait", "consequence")
HIGH, MEDIUM = 0.8, 0.6  # confidence of a finding: high at or above HIGH, medium at or above MEDIUM, else low
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "diagnose")
SIGNATURES = os.path.join(DATA, "signatures.yml")
CODES = os.path.join(DATA, "codes.yml")
CAUSES_FILE = os.path.join(DATA, "causes.yml")
MAX_LINE = 2000  # a line longer than this is cut (a dumped tensor, a base64 blob)


class DiagnoseError(Exception):
    pass


class Knowledge(list):
    """The signatures and code families in matching order (a list, as the callers pass it), with the causes'
    descriptions (causes.yml) the fallback and the nearest causes read."""
    causes = None


# ------------------------------------------------------------------------------------------------- signatures

def _read_yaml(path):
    import yaml  # the controller's (Ansible's) PyYAML; the nodes never load signatures
    try:
        with open(path) as f:
            return yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise DiagnoseError("%s: %s" % (path, e))


def load_causes(path=CAUSES_FILE):
    """causes.yml -> {cause: {means, fix}} for every cause of CAUSES; DiagnoseError naming what is missing."""
    causes = _read_yaml(path).get("causes") or {}
    missing = [c for c in CAUSES if not (causes.get(c) or {}).get("fix")]
    unknown = sorted(set(causes) - set(CAUSES))
    if missing or unknown:
        raise DiagnoseError("%s: causes without a fix: %s; causes not in diagnose.CAUSES: %s" % (
            path, ", ".join(missing) or "none", ", ".join(unknown) or "none"))
    return causes


def load_signatures(path=SIGNATURES, codes=CODES, causes=CAUSES_FILE):
    """The signatures (signatures.yml) then the code families (codes.yml) as data -> a Knowledge list of compiled
    entries; DiagnoseError naming the signature, family or row that is malformed."""
    described = load_causes(causes)
    out = Knowledge(compile_signatures(_read_yaml(path).get("signatures") or [], path))
    out.extend(compile_families(_read_yaml(codes).get("families") or [], described, codes) if codes else [])
    out.causes = described
    return out


def _check(where, name, s):
    if s.get("cause") not in CAUSES:
        raise DiagnoseError("%s: signature %s: cause %r is not one of %s" % (where, name, s.get("cause"),
                                                                             ", ".join(CAUSES)))
    if s.get("kind", "cause") not in KINDS:
        raise DiagnoseError("%s: signature %s: kind %r is not one of %s" % (where, name, s.get("kind"),
                                                                            ", ".join(KINDS)))
    weight = s.get("weight", 50)
    if not isinstance(weight, int) or not 0 < weight <= 100:
        raise DiagnoseError("%s: signature %s: weight %r is not a whole number from 1 to 100" % (where, name, weight))


def _each_named(items, where, what, required):
    """-> (name, item) for each item of a list of the data, its name its id (else its place); DiagnoseError naming an
    item whose name appears twice or that lacks a required key."""
    seen = set()
    for i, item in enumerate(items):
        name = item.get("id") or "#%d" % i
        if name in seen:
            raise DiagnoseError("%s: %s %s appears twice" % (where, what, name))
        seen.add(name)
        for key in required:
            if not item.get(key):
                raise DiagnoseError("%s: %s %s has no %s" % (where, what, name, key))
        yield name, item


def compile_signatures(items, where="signatures"):
    out = []
    for name, s in _each_named(items, where, "signature", ("patterns", "fix", "source")):
        _check(where, name, s)
        try:
            patterns = [re.compile(p, re.I) for p in s["patterns"]]
            unless = [re.compile(p, re.I) for p in s.get("unless") or []]
            raised_in = [re.compile(p) for p in s.get("raised_in") or []]
        except re.error as e:
            raise DiagnoseError("%s: signature %s: %s" % (where, name, e))
        out.append(dict(s, id=name, patterns=patterns, unless=unless, raised_in=raised_in,
                        weight=int(s.get("weight", 50)), kind=s.get("kind", "cause")))
    return out


def _key(text):
    return " ".join(str(text).split()).rstrip(".").upper()


def compile_families(items, causes, where="codes"):
    """codes.yml's families -> one matching entry per family: its patterns (group 1 the code), its rows by code (and
    by the name a row also goes by), its wildcard rows (ERR**005), its prefix ranges and its fallback - each row a
    signature of its own (id the code, its cause, weight, kind, fix, source)."""
    out = []
    for fid, fam in _each_named(items, where, "family", ("match", "cause", "source")):
        try:
            patterns = [re.compile(p, re.I) for p in fam["match"]]
        except re.error as e:
            raise DiagnoseError("%s: family %s: %s" % (where, fid, e))
        if any(p.groups < 1 for p in patterns):
            raise DiagnoseError("%s: family %s: every match needs a group for the code" % (where, fid))

        def row_sig(row, label, weight_default):
            cause = row.get("cause", fam["cause"])
            sig = {"id": label, "cause": cause, "weight": int(row.get("weight", weight_default)),
                   "kind": row.get("kind") or "cause", "family": fid, "code": row.get("code"),
                   "means": row.get("means") or "", "source": row.get("source") or fam["source"],
                   "fix": " ".join(str(row.get("fix") or (causes.get(cause) or {}).get("fix") or "").split())}
            _check(where, "%s/%s" % (fid, label), sig)
            return sig

        fallback = row_sig({"cause": fam["cause"], "means": "a code of this family that no row names",
                            "weight": fam.get("weight", 40)}, "%s:unknown" % fid, 40)
        rows, wild, ranges = {}, [], []
        for row in fam.get("rows") or []:
            code = str(row.get("code") or "")
            if not code:
                raise DiagnoseError("%s: family %s has a row without a code" % (where, fid))
            sig = row_sig(row, code, 50)
            if "*" in code:
                wild.append((re.compile("^" + re.escape(_key(code)).replace(r"\*", r"\d") + "$"), sig))
            elif _key(code) in rows:
                raise DiagnoseError("%s: family %s: code %s appears twice" % (where, fid, code))
            else:
                rows[_key(code)] = sig
            if row.get("name"):
                rows.setdefault(_key(row["name"]), sig)
        for r in fam.get("ranges") or []:
            ranges.append((str(r["prefix"]), row_sig(dict(r, code="%s..." % r["prefix"]), "%s:%s..." % (fid, r["prefix"]),
                                                     fam.get("weight", 40))))
        ranges.sort(key=lambda x: -len(x[0]))
        out.append({"id": fid, "kind": "family", "cause": fam["cause"], "weight": int(fam.get("weight", 40)),
                    "name": fam.get("name") or fid, "source": fam["source"], "patterns": patterns, "unless": [],
                    "rows": rows, "wild": wild, "ranges": ranges, "fallback": fallback,
                    "fix": fallback["fix"]})
    return out


def family_row(family, code):
    """The row a code of this family names: its own, a wildcard one, its prefix range's, else the family's."""
    key = _key(code)
    if key in family["rows"]:
        return family["rows"][key]
    for rx, sig in family["wild"]:
        if rx.match(key):
            return sig
    for prefix, sig in family["ranges"]:
        if key.startswith(prefix.upper()):
            return sig
    return family["fallback"]


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


def _prefilter(signatures):
    """One expression any pattern of any signature or family matches: a line it misses is read no further (the
    signatures of a raising frame read the exception lines of tracebacks, whatever the prefilter says)."""
    cached = getattr(signatures, "_prefilter", None)
    if cached is not None:
        return cached
    parts = ["(?:%s)" % re.sub(r"\(\?P<\w+>", "(?:", p.pattern) for s in signatures if not s.get("raised_in")
             for p in s["patterns"]]
    rx = re.compile("|".join(parts), re.I) if parts else re.compile(r"(?!x)x")
    try:
        signatures._prefilter = rx
    except AttributeError:  # a plain list (tests): compiled per call
        pass
    return rx


FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')


def raising_frames(lines):
    """{id(line): the file of the frame that raised} for every exception line that ends a traceback's frames (the last
    `File "..."` line before it of the same host, source and rank, only the frame's source lines and markers between),
    whether or not the excerpt kept the `Traceback` line."""
    out, last = {}, {}
    for line in lines:
        key = (line["host"], line["source"], line["rank"])
        rest = body(line["text"])
        m = FRAME.match(rest)
        if m:
            last[key] = m.group(1)
            continue
        if key not in last:
            continue
        stripped = rest.strip()
        if not stripped or _indented(line["text"]) or stripped.startswith(("^", "~")):
            continue  # the frame's source line, or its markers
        if EXCEPTION.match(stripped):
            out[id(line)] = last[key]
        del last[key]
    return out


def _raised_by(s, line, frames):
    """Does a signature of a raising frame (`raised_in`) match this line: an exception line a file it names raised,
    of a type its patterns name?"""
    path = frames.get(id(line))
    return bool(path and any(r.search(path) for r in s["raised_in"]) and
                any(p.search(body(line["text"]).strip()) for p in s["patterns"]) and
                not any(u.search(line["text"]) for u in s["unless"]))


def match(lines, signatures):
    """-> [(signature, line)] for every line a signature matches (its `unless` patterns not matching the line); a
    code family gives the signature of the row each code on the line names; a signature of a raising frame
    (`raised_in`) matches the exception lines that a file it names raised."""
    hits = []
    pre = _prefilter(signatures)
    by_frame = [s for s in signatures if s.get("raised_in")]
    frames = raising_frames(lines) if by_frame else {}
    for line in lines:
        text = line["text"]
        if id(line) in frames:
            hits.extend((s, line) for s in by_frame if _raised_by(s, line, frames))
        if not pre.search(text):
            continue
        for s in signatures:
            if s.get("raised_in"):
                continue
            if s["kind"] == "family":
                found = []
                for p in s["patterns"]:
                    for m in p.finditer(text):
                        code = next((g for g in m.groups() if g), None)  # the first group that took part
                        row = family_row(s, code) if code else s["fallback"]
                        if row not in found:
                            found.append(row)
                hits.extend((row, line) for row in found)
            elif any(p.search(text) for p in s["patterns"]) and not any(u.search(text) for u in s["unless"]):
                hits.append((s, line))
    return hits


# ------------------------------------------------------------------------------------------------- error lines

# what a writer puts before its message: an RFC 3339 time (logs --timestamps), a vLLM process tag and header
# ("(EngineCore_DP0 pid=7) ERROR 12-05 01:02:03 [core.py:700] ", before 0.8 "ERROR 12-05 01:02:03 core.py:700] "), a
# CANN header ("[ERROR] HCCL(1,python3):2026-...")
PREFIX = re.compile(r"^\s*(?:\d{4}-\d\d-\d\d[T ][\d:.,]+(?:Z|[+-]\d\d:?\d\d)?\s+)?(?:\[rank\d+\]:\s?)?"
                    r"(?:\([\w. =-]+\)\s+)?"
                    r"(?:(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\s+\d\d-\d\d [\d:.]+\s+"
                    r"(?:\[[^\]]*\]|[\w.]+:\d+\])\s?)?")
# an error level: a logger's, CANN's codes, torch_npu's ERRnnnnn, and c10's / glog's "[E1205 01:02:03.123 file:1]"
LEVEL = re.compile(r"(?:^|[\s(\[])(?:ERROR|CRITICAL|FATAL)(?:[\s:\]]|$)|\[E\]|\bE[0-9A-Z]\d{4}[:\s]|\bERR\d{5}\b"
                   r"|\[E\d{3,4} \d\d:\d\d:\d\d")
EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault)\b(?::|\s*$)"
                       r"|^(?:torch\.)?(?:OutOfMemoryError|DistNetworkError|DistStoreError)\b")
# a failure in words: a traceback, a process that died (SIGSEGV, SIGBUS, SIGKILL, abort), an exception, a library's
# "CANN error" / "NPU error" (or "NCCLerror: ..." as a title writes it), a tool's "vllm serve: error: ...", pydantic's
# "Value error, ..." under a ValidationError, a C++ caller's "Failed to ..." or "XxxYyy fail, ret: 0x9"
FATAL = re.compile(r"Traceback \(most recent call last\)|exited with (?:exit )?code [1-9]|Segmentation fault|"
                   r"core dumped|\bKilled\b|\bAborted\b|\bBus error\b|(?i:Fatal Python error)|"
                   r"(?:^|[\s:])(?:[A-Z]\w*)?(?:Error|Exception): \S|\b(?:CANN|NPU|ACL|HCCL|CUDA|NCCL) error\b|"
                   r"(?:^|[\s:(\[])(?:[A-Za-z_]\w*)?(?i:error): \S|^\s*Value error, \S|"
                   r"^(?:Failed|Unable) to \w|\bfail(?:ed)?, ret(?:code)?\s*[:=]")


def body(text):
    """A line without its writer's prefix (time, process tag, level header)."""
    return PREFIX.sub("", text, count=1)


def _note(head, rest):
    """Did the writer log the line as a warning or a note (its level header says WARNING, INFO or DEBUG)?"""
    return bool(re.search(r"\b(?:WARNING|WARN|INFO|DEBUG)\b", head) or re.match(r"\s*(?:WARNING|WARN|INFO|DEBUG)\b", rest)
                or re.search(r"\[(?:W|WARNING|INFO|I)\]", rest[:40]))


def is_note(text):
    head = PREFIX.match(text)
    return _note(head.group(0), text[head.end():])


def is_error(text):
    """Does the line report an error: an ERROR / CRITICAL level, a CANN or torch_npu code, an exception, a traceback,
    a process that died."""
    head = PREFIX.match(text)
    rest = text[head.end():]
    if _note(head.group(0), rest):
        return bool(EXCEPTION.match(rest.strip()))  # a warning or note reports an error only as an exception
    return bool(LEVEL.search(text[:200]) or EXCEPTION.match(rest.strip()) or FATAL.search(rest))


def _traceback_end(lines, i, limit=400):
    """lines[i] opens a traceback: -> the index of its last line (the exception), looking at the lines of the same
    host, source and rank that follow."""
    first = lines[i]
    for j in range(i + 1, min(len(lines), i + limit)):
        line = lines[j]
        if (line["host"], line["source"]) != (first["host"], first["source"]) or (
                first["rank"] and line["rank"] and line["rank"] != first["rank"]):
            continue
        stripped = body(line["text"]).strip()
        if not stripped or _indented(line["text"]) or stripped.startswith(("File \"", "^", "~", "Traceback")):
            continue
        return j
    return i


def _indented(text):
    """Is the line's message indented (a traceback's source line): its first character after the writer's prefix, or
    the line's own first character where there is no prefix."""
    m = PREFIX.match(text)
    return (text[m.end():] if m.group(0).strip() else text)[:1].isspace()


def first_error(lines, skip=()):
    """The earliest failing rank's first error: of each (host, rank) the first error line, the earliest of them -
    when it opens a traceback, the traceback's last line (the exception). Lines in `skip` (consequences) are passed
    over unless nothing else is left. -> the line, or None for a log without an error."""
    for pass_skip in (True, False):
        firsts = {}
        for i, line in enumerate(lines):
            if pass_skip and id(line) in skip:
                continue
            key = (line["host"], line["rank"] or line["source"])
            if key not in firsts and is_error(line["text"]):
                firsts[key] = i
        if firsts:
            i = min(firsts.values(), key=lambda n: _order(lines[n]))
            text = lines[i]["text"]
            if "Traceback (most recent call last)" in text or _indented(text) or CODE_LINE.match(body(text)):
                i = _traceback_end(lines, i)  # a traceback, or a line of one: its exception
            return lines[i]
    return None


CODE_LINE = re.compile(r"^\s*(?:raise |File \"|return |assert |\^|~)")


def _evidence_key(line):
    """Of two lines a signature matched, the better evidence: a logged message before a line of a traceback's
    source code (`raise ValueError("...")`), then the earlier."""
    return (bool(CODE_LINE.match(body(line["text"]))), _order(line))


def _order(line):
    return (line["time"] if line["time"] is not None else float("inf"), line.get("seq", 0))


def _not_after(a, b):
    """Did line a come no later than line b (by time where both have one, else by place in the same log)?"""
    if a["time"] is not None and b["time"] is not None:
        return a["time"] <= b["time"]
    if (a["host"], a["source"]) == (b["host"], b["source"]):
        return a.get("seq", 0) <= b.get("seq", 0)
    return True


# ------------------------------------------------------------------------------------------------- nearest causes

WORD = re.compile(r"[a-z][a-z0-9]{2,}")
STOP = frozenset("the and for with not was are has have this that from into its which when been but all any can its "
                 "were will would could should there their then than one two out use using please check error "
                 "failed fail failure errors see above below line code reason".split())


def _words(text):
    return [w for w in WORD.findall(re.sub(r"[_\-/.]", " ", str(text).lower())) if w not in STOP]


def _cause_vectors(signatures, causes):
    """{cause: {word: tf-idf}} of what names each cause: its description, its signatures' patterns and ids, its code
    rows' meanings."""
    cached = getattr(signatures, "_vectors", None)
    if cached is not None:
        return cached
    import math
    docs = dict((c, _words(c) + _words((causes.get(c) or {}).get("means", ""))) for c in CAUSES if c != "other")
    for s in signatures:
        rows = [s] if s["kind"] != "family" else list(s["rows"].values()) + [sig for _rx, sig in s["wild"]]
        for r in rows:
            if r["cause"] in docs:
                docs[r["cause"]] += _words(r["id"]) + _words(r.get("means", "")) + _words(
                    " ".join(re.sub(r"\\.|[\[\](){}|?*+^$]", " ", p.pattern) for p in r.get("patterns", [])))
    df = {}
    for words in docs.values():
        for w in set(words):
            df[w] = df.get(w, 0) + 1
    n = len(docs)
    vectors = {}
    for c, words in docs.items():
        tf = {}
        for w in words:
            tf[w] = tf.get(w, 0) + 1
        v = dict((w, (1 + math.log(k)) * math.log(1.0 + n / df[w])) for w, k in tf.items())
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        vectors[c] = dict((w, x / norm) for w, x in v.items())
    try:
        signatures._vectors = vectors
    except AttributeError:
        pass
    return vectors


def nearest_causes(text, signatures, causes, top=3):
    """The causes whose words the line shares most: [{cause, score}] (cosine of tf-idf weights, 0..1), highest
    first; [] when it shares none."""
    import math
    vectors = _cause_vectors(signatures, causes)
    tf = {}
    for w in _words(body(text)):
        tf[w] = tf.get(w, 0) + 1
    q = dict((w, 1 + math.log(k)) for w, k in tf.items())
    norm = math.sqrt(sum(x * x for x in q.values())) or 1.0
    scores = []
    for c, v in vectors.items():
        s = sum(x * v.get(w, 0.0) for w, x in q.items()) / norm
        if s > 0.005:
            scores.append((round(s, 2), c))
    scores.sort(key=lambda x: (-x[0], CAUSES.index(x[1])))
    return [{"cause": c, "score": s} for s, c in scores[:top] if s > 0]


def certainty(confidence):
    return "high" if confidence >= HIGH else "medium" if confidence >= MEDIUM else "low"


def _tls_outliers(tls):
    """{host: {device: 0/1}} -> the hosts with a device whose TLS switch differs from the most common value, [] when
    every device has the same."""
    values = [str(v) for states in tls.values() for v in states.values()]
    if len(set(values)) < 2:
        return []
    common = max(sorted(set(values)), key=values.count)
    return sorted(h for h, states in tls.items() if any(str(v) != common for v in states.values()))


def _down_links(facts):
    """-> [(host, [device, ...])] of the devices whose NIC link is not UP, by host."""
    out = []
    for h, f in sorted((facts or {}).items()):
        down = sorted(int(d) for d, state in (f.get("links") or {}).items() if str(state).upper() != "UP")
        if down:
            out.append((h, down))
    return out


def _link_fix(host, down):
    return ("%s: device NIC link down on NPU %s (hccn_tool -i %d -link -g): fix the cable, the optics or the switch "
            "port, then start again" % (host, ", ".join(str(d) for d in down), down[0]))


def _tls_fix(tls):
    differing = ["%s %s" % (h, _tls_text(tls[h])) for h in sorted(tls)]
    return ("the TLS switch differs between devices (%s): set one value on every device of every node (hccn_tool -i "
            "<dev> -tls -s enable 0 or 1) and start again" % "; ".join(differing))


def _node_tls(facts):
    return dict((h, f["tls"]) for h, f in (facts or {}).items() if isinstance(f.get("tls"), dict) and f["tls"])


def refine(cause, fix, host, facts):
    """A cause the log alone cannot tell apart, told apart by the hosts' facts (what preflight reads: the TLS switch
    of every device, which interface owns HCCL_IF_IP, each device's link): -> (cause, fix, the host whose facts show
    the fault or None, which fact told: tls, nic or link)."""
    if cause != "hccl_connect_timeout" or not facts:
        return cause, fix, None, None
    tls = _node_tls(facts)
    outliers = _tls_outliers(tls)
    if outliers:
        return "tls_mismatch", _tls_fix(tls), outliers[0], "tls"
    for h, f in sorted(facts.items()):
        if f.get("if_ip") and f.get("socket_ifname") and f["if_ip"] not in (f.get("addresses") or {}).get(
                f["socket_ifname"], []):
            return "nic_or_ip_wrong", ("%s: HCCL_SOCKET_IFNAME=%s does not own HCCL_IF_IP=%s: set npuops_nic to the "
                                       "interface that holds the node's address" % (h, f["socket_ifname"], f["if_ip"])), \
                h, "nic"
    down = _down_links(facts)
    if down:
        return cause, "%s; %s" % ("; ".join(_link_fix(h, d) for h, d in down), fix), down[0][0], "link"
    return cause, fix, None, None


def fact_findings(facts, explained, after):
    """What the hosts' facts show by themselves - a device NIC link down, TLS switches that differ - as findings
    naming the host, the devices and the fix, for the faults no finding of the logs already explains (`explained`:
    the facts a finding was told apart by). `after`: a cause of the logs came first (they follow it); with quiet
    logs they lead."""
    out = []

    def finding(cause, host, evidence, fix, weight, reference):
        f = facts[host]
        at = f.get("read_at")
        return {"cause": cause, "fix": fix, "evidence": evidence, "host": host, "rank": None, "time": iso(at),
                "confidence": round(weight / 100.0, 2), "certainty": certainty(weight / 100.0), "kind": "cause",
                "signature": "facts", "code": None, "source": "facts", "reference": reference, "weight": weight,
                "hosts": [host], "facts_host": host, "_demoted": after, "_first": None,
                "_line": {"time": at, "seq": 0}}
    if "link" not in explained:
        for h, down in _down_links(facts):
            out.append(finding("device_link_down", h, "; ".join(
                "%s: NPU %d link DOWN (hccn_tool -i %d -link -g)" % (h, d, d) for d in down), _link_fix(h, down),
                FACT_LINK_WEIGHT, "hccn_tool -i <dev> -link -g (the device NIC's link state, read on the node)"))
    tls = _node_tls(facts)
    outliers = _tls_outliers(tls)
    if outliers and "tls" not in explained:
        out.append(finding("tls_mismatch", outliers[0], "TLS switch (hccn_tool -i <dev> -tls -g): %s" % "; ".join(
            "%s %s" % (h, _tls_text(tls[h])) for h in sorted(tls)), _tls_fix(tls), FACT_TLS_WEIGHT,
            "hccn_tool -i <dev> -tls -g (each device's TLS switch, read on the node)"))
    return out


def _tls_text(states):
    """{device: 0/1} -> 'tls 0,0,1,...' in device order."""
    return "tls " + ",".join(str(states[d]) for d in sorted(states, key=lambda x: int(x) if str(x).isdigit() else 0))


def analyze(lines, signatures, facts=None, limit=20):
    """Lines (lines_of) -> findings ordered by likelihood: [{cause, fix, evidence, host, rank, time, confidence,
    certainty, signature, code, source, reference, hosts, weight}].

    One finding per cause: its evidence is the earliest line of its most specific signature or code, `hosts` every
    host that printed it (first failing first), its confidence the signature's weight / 100. Ordered by confidence,
    then time - except that a wait (an HCCL or store timeout) follows any cause of at least medium confidence seen no
    later than it, and a consequence follows every cause. A log with an error line always gets a finding: when no
    cause reaches medium confidence, `other` carries the earliest failing rank's first error line (the last line of
    its first traceback) and the nearest causes with their scores (`candidates`). Findings of equal confidence are
    marked `tied` with each other."""
    for i, line in enumerate(lines):
        line.setdefault("seq", i)
    causes = getattr(signatures, "causes", None) or load_causes()
    hits = match(lines, signatures)
    by_cause, others = {}, []
    for s, line in hits:
        if s["kind"] == "wait" and s["weight"] > NOTE_WAIT_MAX and is_note(line["text"]):
            # a wait its writer logs as a warning or a note is still waiting (vLLM repeats its shared-memory broadcast
            # note while a reader compiles): no failure on its own, so it names its cause with low confidence only
            s = dict(s, weight=NOTE_WAIT_MAX)
        if s["cause"] == "other":
            others.append((s, line))
            continue
        entry = by_cause.setdefault(s["cause"], {"sig": s, "line": line, "first": line, "hosts": {}, "by_host": {}})
        t = line["time"] if line["time"] is not None else float("inf")
        if line["host"] is not None:
            entry["hosts"][line["host"]] = min(entry["hosts"].get(line["host"], float("inf")), t)
            best = entry["by_host"].get(line["host"])
            if best is None or (-s["weight"], _evidence_key(line)) < (-best[0]["weight"], _evidence_key(best[1])):
                entry["by_host"][line["host"]] = (s, line)  # each host's best line, as the entry keeps the best of all
        if _order(line) < _order(entry["first"]):
            entry["first"] = line
        heavier = s["weight"] > entry["sig"]["weight"]
        if heavier or (s["weight"] == entry["sig"]["weight"] and _evidence_key(line) < _evidence_key(entry["line"])):
            entry.update(sig=s, line=line)
    findings = [_finding(c, e["sig"], e["line"], e["first"], e["hosts"], facts, e["by_host"])
                for c, e in by_cause.items()]
    for f in findings:
        if f["kind"] == "wait":
            f["_demoted"] = any(c["kind"] == "cause" and c["confidence"] >= MEDIUM and _not_after(c["_first"], f["_first"])
                                for c in findings)
    other = _other(lines, others, findings, signatures, causes)
    if other:
        findings.append(other)
    if facts:
        explained = set(f["_told_by"] for f in findings if f.get("_told_by"))
        findings += fact_findings(facts, explained, after=any(
            not f["_demoted"] and f["confidence"] >= MEDIUM for f in findings))
    findings.sort(key=lambda f: (f["_demoted"], -f["confidence"], _order(f["_line"]), CAUSES.index(f["cause"])))
    for f in findings:
        f["tied"] = [g["cause"] for g in findings if g is not f and not g["_demoted"] and not f["_demoted"]
                     and g["confidence"] == f["confidence"]]
        if not f["tied"]:
            del f["tied"]
    for f in findings:
        for k in ("_demoted", "_first", "_line", "_told_by"):
            f.pop(k, None)
    return findings[:limit]


def _finding(cause, s, line, first, hosts, facts, by_host=None):
    """A finding of one cause: its evidence line, host and rank - unless the hosts' facts show which host is at fault
    (refine): then that host, with its own line where it printed the symptom as specifically as any host did, else
    the best line, of the host that printed it (`logged_on`)."""
    fixed_cause, fix, fault_host, told_by = refine(cause, s["fix"], line["host"], facts)
    logged = line
    own = (by_host or {}).get(fault_host) if fault_host is not None else None
    if own is not None and own[0]["weight"] >= s["weight"]:
        line = own[1]
    f = {"cause": fixed_cause, "fix": _filled(fix, s, line), "evidence": line["text"].strip(),
         "host": fault_host or line["host"], "rank": line["rank"] if line["host"] == (fault_host or line["host"]) else
         None, "time": iso(line["time"]), "confidence": round(s["weight"] / 100.0, 2),
         "certainty": certainty(s["weight"] / 100.0), "kind": s["kind"], "signature": s["id"], "code": s.get("code"),
         "source": line["source"], "reference": s["source"], "weight": s["weight"],
         "hosts": [h for h, _t in sorted(hosts.items(), key=lambda x: (x[1], x[0]))],
         "_demoted": s["kind"] == "consequence", "_first": first, "_line": line, "_told_by": told_by}
    if fault_host is not None:
        f["facts_host"] = fault_host
        if line["host"] != fault_host:
            f["logged_on"] = logged["host"]
    return f


def _filled(fix, s, line):
    """A fix's <placeholders> filled from the named groups of the signature's pattern on the evidence line (npu-smi's
    card and chip)."""
    for p in s.get("patterns") or []:
        m = p.search(line["text"]) if "<" in fix else None
        if m:
            for k, v in m.groupdict().items():
                if v is not None:
                    fix = fix.replace("<%s>" % k, v)
            break
    return fix


NOTE_WAIT_MAX = 55  # a wait logged as a warning or note: low confidence at most
FACT_LINK_WEIGHT = 85  # hccn_tool read a device NIC link DOWN: a fault seen, not inferred
FACT_TLS_WEIGHT = 80  # the TLS switches differ: HCCL cannot link those devices
OTHER_FALLBACK = 30  # the weight of `other` when only the first error line speaks
OTHER_MAX = 55  # `other` never claims more than low confidence: it names no cause


def _other(lines, others, findings, signatures, causes):
    """The `other` finding: when no cause reaches medium confidence, the earliest failing rank's first error line
    with the nearest causes; else, where lines of no known cause were seen, the earliest of them after the causes."""
    strong = any(f["confidence"] >= MEDIUM for f in findings)
    consequences = set(id(line) for s, line in others if s["kind"] == "consequence")
    line = None if strong else first_error(lines, skip=consequences)
    if line is None and not others:
        return None
    if line is None:
        told = [(s, ln) for s, ln in others if s["kind"] != "consequence"] or others
        line = min(told, key=lambda x: _order(x[1]))[1]
    on_line = [s for s, ln in others if ln is line]
    s = max(on_line, key=lambda x: x["weight"]) if on_line else {
        "id": "first_error_line", "kind": "cause", "weight": OTHER_FALLBACK, "source": "the log's first error",
        "fix": " ".join(causes["other"]["fix"].split()), "code": None}
    weight = min(s["weight"], OTHER_MAX)
    hosts = {}
    for _s, ln in others:
        if ln["host"] is not None:
            hosts[ln["host"]] = min(hosts.get(ln["host"], float("inf")), ln["time"] if ln["time"] is not None else
                                    float("inf"))
    if line["host"] is not None:
        hosts.setdefault(line["host"], line["time"] if line["time"] is not None else float("inf"))
    f = _finding("other", dict(s, weight=weight), line, line, hosts, None)
    f["_demoted"] = strong or bool(findings and s["kind"] == "consequence" and not findings[0].get("_demoted"))
    if not strong:
        f["candidates"] = nearest_causes(line["text"], signatures, causes)
    return f


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


def host_facts(collected, offset=0.0):
    """What refine() and fact_findings() read of one host's collect(): tls, links, addresses, if_ip and socket_ifname
    of its engine, and when it was read (its clock less its offset)."""
    facts = collected.get("facts") or {}
    env = {}
    for values in (facts.get("env") or {}).values():
        env.update(values)
    tls = dict((d, v) for d, v in (facts.get("tls") or {}).items() if v is not None)
    return {"tls": tls, "links": dict((d, v) for d, v in (facts.get("links") or {}).items() if v is not None),
            "addresses": facts.get("addresses") or {}, "if_ip": env.get("HCCL_IF_IP"),
            "socket_ifname": env.get("HCCL_SOCKET_IFNAME"),
            "read_at": (collected["clock"] - offset) if collected.get("clock") is not None else None}


def diagnose_hosts(collected, signatures, limit=20):
    """{host: collect()} -> findings over every host, each host's clock offset (against the others', read at about
    the same moment) taken off its lines."""
    offsets = clock_offsets(dict((h, c.get("clock")) for h, c in collected.items()))
    lines = []
    for h, c in sorted(collected.items()):
        for src in c.get("sources") or []:
            lines += lines_of(src.get("text"), host=h, source=src.get("source"), offset=offsets.get(h, 0.0))
    facts = dict((h, host_facts(c, offsets.get(h, 0.0))) for h, c in collected.items())
    return analyze(lines, signatures, facts, limit), offsets


def brief(findings):
    """What the offline CLI prints per finding (with `candidates` for `other`, `tied` where causes tie)."""
    keys = ("cause", "fix", "evidence", "host", "rank", "time", "confidence", "certainty")
    return [dict([(k, f.get(k)) for k in keys] + [(k, f[k]) for k in ("candidates", "tied") if k in f])
            for f in findings]


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
