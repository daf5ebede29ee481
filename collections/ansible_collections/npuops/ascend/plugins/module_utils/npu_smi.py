# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse what npu-smi and the Ascend driver/CANN files print, into plain data.

Rules learned from the field (npu-smi dumps in vllm-ascend issues; #12980 widened the table): parse by regex and header names, never by column
offsets (npu-smi 26.0.rc2 widened the table; five-digit values lose their padding: ``54592/ 65536``);
build the card/chip -> logic/physical id map from ``npu-smi info -m``, never from ``card*2+chip``
(NPU ids need not start at 0); skip ``Mcu`` rows. Standard library only: this runs on the nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.npuops.ascend.plugins.module_utils import proc

DRIVER_DIR = "/usr/local/Ascend/driver"
TOOLKIT_DIR = "/usr/local/Ascend/ascend-toolkit/latest"
DCMI_FAILURE = "dcmi module initialize failed"
HEALTH_STATES = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN")

_FRACTION = re.compile(r"(\d+)\s*/\s*(\d+)")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_VERSION = re.compile(r"npu-smi\s+(\S+)\s+Version:\s*(\S+)")


class NpuSmiError(Exception):
    """npu-smi could not be used; the message says what was seen and what to do."""


def check_output(text, command="npu-smi info"):
    """Raise NpuSmiError when npu-smi printed a driver failure instead of data."""
    if DCMI_FAILURE in text:
        line = next((x.strip() for x in text.splitlines() if DCMI_FAILURE in x), DCMI_FAILURE)
        raise NpuSmiError(
            "%s failed: %r. The NPU driver is not usable here: check that the driver is installed and "
            "loaded (/dev/davinci_manager exists), or restart the devices (error -8005 means a device did "
            "not start)" % (command, line))


def _cells(line):
    line = line.strip()
    if not line.startswith("|"):
        return None
    return [c.strip() for c in line.strip("|").split("|")]


def _number(text):
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return None


def parse_info(text):
    """``npu-smi info`` -> {version, chips: [...], processes: [...]}.

    Each chip comes from a pair of rows: (NPU id, name | health | power temp hugepages) then
    (chip [phy-id] | bus id | aicore memory hbm). Works for A2 and A3 and the widened 26.0 table.
    """
    check_output(text)
    version = None
    m = _VERSION.search(text)
    if m:
        version = m.group(2)
    chips = []
    processes = []
    pending = None
    in_processes = False
    for line in text.splitlines():
        cells = _cells(line)
        if cells is None:
            continue
        joined = " ".join(cells)
        if "Process id" in joined and "Process name" in joined:
            in_processes = True
            pending = None
            continue
        if in_processes:
            proc = _process_row(cells)
            if proc is not None:
                processes.append(proc)
            continue
        if len(cells) < 3:
            continue
        first = cells[0].split()
        if pending is None:
            # first row of a chip: "<npu id> <name>" | health | "<power> <temp> <hugepages>"
            if len(first) >= 2 and first[0].isdigit() and cells[1].split()[:1] and \
                    _FRACTION.search(cells[2]) is not None:
                right = cells[2].split()
                pending = {
                    "card": int(first[0]),
                    "name": " ".join(first[1:]),
                    "health": cells[1].split()[0] if cells[1] else "UNKNOWN",
                    "power_w": None if right[0] == "-" else _number(right[0]),
                    "temp_c": _number(right[1]) if len(right) > 1 else None,
                }
            continue
        # second row: "<chip> [<phy id>]" | bus id | "<aicore> <memory used/total> [<hbm used/total>]"
        if first and first[0].isdigit() and _BUS_ID.match(cells[1] or ""):
            fractions = _FRACTION.findall(cells[2])
            chip = dict(pending)
            chip["chip"] = int(first[0])
            chip["table_phy_id"] = int(first[1]) if len(first) > 1 and first[1].isdigit() else None
            chip["bus_id"] = cells[1]
            aicore = cells[2].split()[0] if cells[2] else None
            chip["aicore_pct"] = _number(aicore) if aicore else None
            if len(fractions) >= 2:
                chip["hbm_used_mb"], chip["hbm_total_mb"] = int(fractions[-1][0]), int(fractions[-1][1])
            else:
                # 310P-style tables have no HBM column
                chip["hbm_used_mb"] = chip["hbm_total_mb"] = None
            chips.append(chip)
        pending = None
    return {"npu_smi_version": version, "chips": chips, "processes": processes}


def _process_row(cells):
    if len(cells) < 4:
        return None
    ids = cells[0].split()
    if len(ids) < 2 or not (ids[0].isdigit() and ids[1].isdigit()) or not cells[1].isdigit():
        return None
    memory = _number(cells[-1].split()[0]) if cells[-1] else None
    return {"card": int(ids[0]), "chip": int(ids[1]), "pid": int(cells[1]), "name": cells[2] or None,
            "memory_mb": memory}


def parse_mapping(text):
    """``npu-smi info -m`` -> [{card, chip, logic_id, phy_id, name}], Mcu rows skipped.

    Columns are found by header name. Without a ``Chip Logic ID`` column (Ascend 950) the NPU id is
    the logical id; without ``Chip Phy-ID`` (A2 drivers) the physical id equals the logical id.
    """
    check_output(text, "npu-smi info -m")
    lines = [x for x in text.splitlines() if x.strip()]
    header_at = next((i for i, x in enumerate(lines) if "NPU ID" in x and "Chip" in x), None)
    if header_at is None:
        raise NpuSmiError("npu-smi info -m printed no header with 'NPU ID' and 'Chip': %r" % text[:200])
    header = [h.strip() for h in re.split(r"\t+|\s{2,}", lines[header_at].strip()) if h.strip()]
    known = ("NPU ID", "Slot ID", "Chip ID", "Chip Logic ID", "Chip Phy-ID", "Chip Name")
    unknown = [h for h in header if h not in known]
    if unknown:
        raise NpuSmiError("npu-smi info -m has unknown columns %s (known: %s)" % (unknown, ", ".join(known)))
    if header[-1] != "Chip Name":
        raise NpuSmiError("npu-smi info -m: expected 'Chip Name' as the last column, got %r" % header)
    chips = []
    for line in lines[header_at + 1:]:
        tokens = line.split()
        if len(tokens) < len(header):
            continue
        row = dict(zip(header[:-1], tokens[:len(header) - 1]))
        row["Chip Name"] = " ".join(tokens[len(header) - 1:])
        if row["Chip Name"] == "Mcu" or row.get("Chip Logic ID") == "-":
            continue
        if not row["NPU ID"].isdigit():
            continue
        logic = row.get("Chip Logic ID", row["NPU ID"])
        phy = row.get("Chip Phy-ID", logic)
        chips.append({
            "card": int(row["NPU ID"]),
            "chip": int(row.get("Chip ID", "0")),
            "logic_id": int(logic),
            "phy_id": int(phy) if str(phy).isdigit() else int(logic),
            "name": row["Chip Name"],
        })
    if not chips:
        raise NpuSmiError("npu-smi info -m listed no chips (only Mcu rows or nothing): %r" % text[:300])
    return chips


def parse_key_values(text):
    """``Key : Value`` lines (``npu-smi info -t ...`` and ``-l``) -> list of blocks (dicts).

    A new block starts at a blank line or when a key repeats.
    """
    blocks = [{}]
    for line in text.splitlines():
        m = re.match(r"^\s*(.+?)\s*:\s*(.*?)\s*$", line)
        if not m:
            if line.strip() == "" and blocks[-1]:
                blocks.append({})
            continue
        key, value = m.group(1), m.group(2)
        if key in blocks[-1]:
            blocks.append({})
        blocks[-1][key] = value
    return [b for b in blocks if b]


def parse_list(text):
    """``npu-smi info -l`` -> {card: chip count}."""
    check_output(text, "npu-smi info -l")
    cards = {}
    for block in parse_key_values(text):
        if "NPU ID" in block and block["NPU ID"].isdigit():
            cards[int(block["NPU ID"])] = int(block.get("Chip Count", "1") or 1)
    return cards


def parse_assignments(text):
    """``Key=Value`` files: driver version.info, ascend_install.info, CANN install info."""
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _sep, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def build_facts(info, mapping, board=None, driver_info=None, cann_info=None):
    """Join the table, the id map and the version sources into ``ansible_facts.npu``.

    The table lists chips card by card; the map says which logic/physical id each (card, chip) has.
    """
    by_key = {(c["card"], c["chip"]): c for c in mapping}
    chips = []
    for row in info["chips"]:
        ids = by_key.get((row["card"], row["chip"]))
        if ids is None:
            raise NpuSmiError("npu-smi info lists card %s chip %s, which npu-smi info -m does not map"
                              % (row["card"], row["chip"]))
        chips.append({
            "card": row["card"], "chip": row["chip"], "logic_id": ids["logic_id"], "phy_id": ids["phy_id"],
            "bus_id": row["bus_id"], "health": row["health"], "hbm_used_mb": row["hbm_used_mb"],
            "hbm_total_mb": row["hbm_total_mb"], "power_w": row["power_w"], "temp_c": row["temp_c"],
            "name": row["name"],
        })
    if len(chips) != len(mapping):
        raise NpuSmiError("npu-smi info shows %d chips but npu-smi info -m maps %d" % (len(chips), len(mapping)))
    chips.sort(key=lambda c: c["logic_id"])
    per_card = {}
    for c in mapping:
        per_card[c["card"]] = per_card.get(c["card"], 0) + 1
    chips_per_card = max(per_card.values()) if per_card else 0
    names = sorted({c["name"] for c in chips})
    board = board or {}
    driver_info = driver_info or {}
    cann_info = cann_info or {}
    npu_name = board.get("NPU Name")
    return {
        "generation": "A3" if chips_per_card == 2 else ("A2" if chips_per_card == 1 else None),
        "chip_model": names[0] if len(names) == 1 else ",".join(names),
        "soc": ("Ascend910_%s" % npu_name) if npu_name else None,
        "card_count": len(per_card),
        "chips_per_card": chips_per_card,
        "chip_count": len(chips),
        "npu_smi_version": info.get("npu_smi_version"),
        "driver_version": driver_info.get("Version") or board.get("Software Version") or None,
        "firmware_version": board.get("Firmware Version") or None,
        "cann_version": cann_info.get("version") or None,
        "chips": chips,
        "processes": [dict(p) for p in info["processes"]],
    }


def version_tuple(text):
    """'25.5.1' -> (25, 5, 1); '24.1.rc3.7' -> (24, 1, -3, 7): release candidates sort before releases."""
    if not text:
        return ()
    parts = []
    for piece in re.split(r"[.\-]", str(text).lower()):
        m = re.match(r"^(rc|alpha|beta|t)(\d*)$", piece)
        if m:
            parts.append(-int(m.group(2) or 0) - (100 if m.group(1) != "rc" else 0))
        elif piece.isdigit():
            parts.append(int(piece))
    return tuple(parts)


SEARCH_DIRS = ["/usr/local/bin", "/usr/local/sbin"]


def locate(get_bin_path, path=None, exists=os.path.exists):
    """The npu-smi to run: `path` when given, else found on PATH or in SEARCH_DIRS (`get_bin_path`: the module's).
    Raises NpuSmiError saying where it looked and what to do."""
    tool = path or get_bin_path("npu-smi", opt_dirs=SEARCH_DIRS)
    if not tool or not exists(tool):
        raise NpuSmiError("npu-smi not found (looked on PATH, %s%s): install the Ascend driver, which provides it, "
                          "or set npu_smi_path" % (", ".join(SEARCH_DIRS), ", " + path if path else ""))
    return tool


def runner(tool, timeout, run=proc.run):
    """`npu-smi <args>` -> its output; NpuSmiError when it hangs (a wedged driver), prints a DCMI failure or
    exits non-zero. Each call is bounded by `timeout` seconds."""
    def call(*args):
        rc, out, err = run([tool] + list(args), timeout)
        command = "npu-smi " + " ".join(args)
        if rc == proc.TIMED_OUT:
            raise NpuSmiError("%s did not answer within %ss: the driver may be wedged (check dmesg, then reset the "
                              "device or reboot the node)" % (command, timeout))
        text = out + err
        check_output(text, command)
        if rc != 0:
            raise NpuSmiError("%s failed (rc=%d): %s" % (command, rc, text.strip()[-300:]))
        return text
    return call


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (IOError, OSError):
        return None


def discover(call, driver_dir=DRIVER_DIR, toolkit_dir=TOOLKIT_DIR, read=_read, listdir=os.listdir,
             isdir=os.path.isdir):
    """The node's NPU facts (build_facts) from npu-smi (`call`, see runner) and the driver and CANN version files.
    Raises NpuSmiError naming the command that failed."""
    info = parse_info(call("info"))
    mapping = parse_mapping(call("info", "-m"))
    first_card = min(c["card"] for c in mapping)
    board = parse_key_values(call("info", "-t", "board", "-i", str(first_card)))
    chip_board = parse_key_values(call("info", "-t", "board", "-i", str(first_card), "-c", "0"))
    merged = dict(board[0] if board else {})
    merged.update(chip_board[0] if chip_board else {})
    driver = parse_assignments(read(os.path.join(driver_dir, "version.info")) or "")
    cann_text = None
    if isdir(toolkit_dir):
        for entry in sorted(listdir(toolkit_dir)):
            cann_text = read(os.path.join(toolkit_dir, entry, "ascend_toolkit_install.info"))
            if cann_text:
                break
    return build_facts(info, mapping, board=merged, driver_info=driver, cann_info=parse_assignments(cann_text or ""))
