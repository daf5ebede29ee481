# -*- coding: utf-8 -*-
"""The error-code tables (data/diagnose/codes.yml): every row of every family, written as its stack prints it, gives
the row's cause; a code of the family that no row names gives the family's cause with a lower confidence."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

import pytest
import yaml

from ansible_collections.npuops.ascend.plugins.module_utils import diagnose

with open(diagnose.CODES) as _f:
    FAMILIES = yaml.safe_load(_f)["families"]

# how each family's codes appear in a log line, as the code that prints them writes it
CANN = "[ERROR] 2026-12-05-01:02:03 (PID:7, Device:0, RankID:0) {code}: [PID: 7] 2026-12-05-01:02:03.123.456 failed"
LINES = dict(
    [("cann_" + x, CANN) for x in ("ee", "eh", "ei", "ej", "el", "ez", "ek", "ep", "e1", "e2", "e3", "e4", "e5",
                                   "e6", "e7", "e8", "e9", "ea", "eb", "ef", "em", "eo")],
    torch_npu="[ERROR] 2026-12-05-01:02:03 (PID:7, Device:0, RankID:0) {code} PTA call acl api failed",
    acl="RuntimeError: NPU function error: aclrtSynchronizeStream(stream), error code is {code}",
    runtime="rtStreamSynchronize execute failed, reason=[{code}][FUNC:FuncErrorReason][FILE:error_message_manage.cc]",
    hccl="RuntimeError: HCCL function error: HcclAllreduce(inputs, outputs, count), error code is {code}",
    mooncake_store="E1205 01:02:03.123 client.cpp:1] Failed to put key, error: {code}",
    dcmi="dcmi module initialize failed. ret is {code}",
)
NAMED = {"acl": "RuntimeError: NPU function error: {code}", "hccl": "HCCL returned {code}",
         "dcmi": "npu-smi: dcmi_get_card_num_list failed: {code}"}


@pytest.fixture(scope="module")
def knowledge():
    return diagnose.load_signatures()


def entry_of(knowledge, family):
    return [k for k in knowledge if k["id"] == family["id"]][0]


def concrete(entry, code):
    """A code as the stack prints it: ERR**005 (any module) -> ERR99005; a prefix range 507... -> the highest code of
    it that no row names."""
    if not code.endswith("..."):
        return code.replace("*", "9")
    prefix = code[:-3]
    return next(c for c in ("%s%0*d" % (prefix, 6 - len(prefix), n) for n in range(10 ** (6 - len(prefix)) - 1, 0, -1))
                if diagnose.family_row(entry, c)["id"] == "%s:%s" % (entry["id"], code))


def finding_of(knowledge, line):
    found = diagnose.analyze(diagnose.lines_of(line, source="t"), knowledge)
    assert found, line
    return found[0]


def test_every_family_has_a_table_test():
    assert sorted(f["id"] for f in FAMILIES) == sorted(LINES)


@pytest.mark.parametrize("family", FAMILIES, ids=[f["id"] for f in FAMILIES])
def test_a_code_of_each_row_gives_its_cause_and_its_weight(knowledge, family):
    entry = entry_of(knowledge, family)
    rows = list(family.get("rows") or []) + [dict(r, code=r["prefix"] + "...") for r in family.get("ranges") or []]
    assert family["source"] and entry["fallback"], family["id"]  # a family without rows has its fallback only
    for row in rows:
        cause = row.get("cause", family["cause"])
        for code, template in [(concrete(entry, str(row["code"])), LINES[family["id"]])] + (
                [(row["name"], NAMED[family["id"]])] if row.get("name") else []):
            f = finding_of(knowledge, template.format(code=code))
            weight = row.get("weight", 50) if cause != "other" else min(row.get("weight", 50), diagnose.OTHER_MAX)
            assert (f["cause"], f["confidence"]) == (cause, weight / 100.0), (family["id"], code, f)
            assert f["signature"] in (str(row["code"]), "%s:%s" % (family["id"], row["code"])), (code, f)
            assert row.get("source", family["source"]) == f["reference"]


@pytest.mark.parametrize("family", FAMILIES, ids=[f["id"] for f in FAMILIES])
def test_a_code_no_row_names_gives_the_family_s_cause_with_a_lower_confidence(knowledge, family):
    entry = entry_of(knowledge, family)
    unknown = [c for c in unknown_codes(family["id"]) if diagnose.family_row(entry, c) is entry["fallback"]]
    if family["id"] == "mooncake_store":  # its match names the codes one by one: each has its row
        assert not unknown
        return
    f = finding_of(knowledge, LINES[family["id"]].format(code=unknown[0]))
    weights = [r.get("weight", 50) for r in (family.get("rows") or []) + (family.get("ranges") or [])
               if r.get("kind") != "consequence"] or [100]  # a consequence's row is weaker than any cause
    assert f["cause"] == family["cause"] and f["signature"] == family["id"] + ":unknown", f
    assert f["confidence"] == family.get("weight", 40) / 100.0 <= min(weights) / 100.0


def unknown_codes(family):
    if family.startswith("cann_"):
        letter = {"ee": "EE", "eh": "EH", "ei": "EI", "ej": "EJ", "el": "EL", "ez": "EZ", "ek": "EK", "ep": "EP",
                  "ea": "EA", "eb": "EB", "ef": "EF", "em": "EM", "eo": "EO"}.get(family[5:], "E" + family[6:])
        return ["%s%04d" % (letter, n) for n in range(8999, 1000, -1)]
    return {"torch_npu": ["ERR%05d" % n for n in range(99999, 0, -1)],
            "acl": ["%06d" % n for n in range(999999, 100000, -1)],
            "runtime": ["a reason no table holds"],
            "hccl": [str(n) for n in range(99, 0, -1)],
            "dcmi": ["-8%03d" % n for n in range(999, 0, -1)],
            "mooncake_store": re.findall(r"[A-Z_]{4,}", [f for f in FAMILIES if f["id"] == family][0]["match"][0])}[family]
