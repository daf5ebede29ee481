#!/usr/bin/python3
"""Simulated `npu-smi` for the npuops test cluster (test infrastructure, not a product).

`render_all()` renders every answer into files that `npu_smi.sh` (installed as npu-smi on the nodes)
prints, as cheap to call as the real binary; `main()` answers directly (used by the tests). It prints the formats of the real tool (as the env dumps in vllm-ascend issues show them, e.g. #2035 for A3, #12980 for
npu-smi 26's wider table; vllm-ascend cpu_binding.py for `-m`) from the node's
profile, which `npuops_sim` writes where the real driver keeps its state (driver lib64), so the same
tool also answers inside a container that mounts the driver as vLLM-Ascend containers do.
Standard library only: it runs with the node's system Python and inside the sim image.
"""
import json
import os
import sys

PROFILE = os.environ.get("NPUOPS_SIM_PROFILE", "/usr/local/Ascend/driver/lib64/npuops_sim/profile.json")
DCMI_FAIL = "dcmi module initialize failed. ret is -8005"


def load_profile():
    # The real npu-smi talks to the driver through /dev/davinci_manager; without it DCMI fails.
    if not os.path.exists(os.environ.get("NPUOPS_SIM_DEVMGR", "/dev/davinci_manager")):
        return None
    try:
        with open(PROFILE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def widths(profile):
    # npu-smi 26.0.rc2 widened the right block from 52 to 70 columns (vllm-ascend#12980).
    if profile.get("table_style") == "wide":
        return 27, 15, (1, 21, 24, 24)
    return 27, 15, (1, 12, 18, 21)


def border(profile, ch="-", joints=True):
    left, mid, right = widths(profile)
    rw = sum(right)
    if not joints:
        return "+" + ch * (left + mid + rw + 2) + "+"
    return "+" + ch * left + "+" + ch * mid + "+" + ch * rw + "+"


def row(profile, left_cells, mid, right_cells):
    lw, mw, rws = widths(profile)
    left = " " + left_cells[0].ljust(6) + left_cells[1].ljust(lw - 7)
    midc = " " + mid.ljust(mw - 1)
    right = " " * rws[0] + "".join(c.ljust(w) for c, w in zip(right_cells, rws[1:]))
    right = right.ljust(sum(rws))
    return "|" + left + "|" + midc + "|" + right[: sum(rws)] + "|"


def frac(used, total):
    return "%-5s/ %s" % (used, total)


def chips(profile):
    for card in profile["cards"]:
        for chip in card["chips"]:
            yield card, chip


def info_table(p):
    lw, mw, rws = widths(p)
    inner = lw + mw + sum(rws) + 2
    ver = p["npu_smi_version"]
    out = [border(p, "-", joints=False)]
    out.append("| " + ("npu-smi " + ver).ljust(33) + ("Version: " + ver).ljust(inner - 34) + "|")
    out.append(border(p))
    a3 = p["generation"] == "A3"
    out.append(row(p, ["NPU", "Name"], "Health", ["Power(W)", "Temp(C)", "Hugepages-Usage(page)"]))
    out.append(row(p, ["Chip", "Phy-ID" if a3 else ""], "Bus-Id", ["AICore(%)", "Memory-Usage(MB)", "HBM-Usage(MB)"]))
    out.append(border(p, "="))
    for card in p["cards"]:
        n = len(card["chips"])
        for i, chip in enumerate(card["chips"]):
            power = "-" if chip.get("power_w") is None else "%.1f" % chip["power_w"]
            out.append(row(p, [str(card["npu_id"]), chip["name"]], chip["health"],
                           [power, str(chip["temp_c"]), frac(0, 0)]))
            out.append(row(p, [str(chip["chip_id"]), str(chip["phy_id"]) if a3 else ""], chip["bus_id"],
                           [str(chip.get("aicore_pct", 0)), frac(0, 0), frac(chip["hbm_used_mb"], chip["hbm_total_mb"])]))
            out.append(border(p, "=") if i == n - 1 else border(p, "-", joints=False))
    procs = p.get("processes", [])
    lwid = lw + mw + sum(rws) + 2
    out.append(border(p))
    memw = sum(rws) - 28  # right block: " " name(25) "|" " " memory
    out.append("| NPU     Chip              | Process id    | Process name             | "
               + "Process memory(MB)".ljust(memw) + "|")
    out.append(border(p, "="))
    for card in p["cards"]:
        mine = [q for q in procs if q["npu_id"] == card["npu_id"]]
        if not mine:
            out.append("| " + ("No running processes found in NPU %s" % card["npu_id"]).ljust(lwid - 1) + "|")
        for q in mine:
            out.append("| " + str(q["npu_id"]).ljust(8) + str(q["chip_id"]).ljust(lw - 9) + "| "
                       + str(q["pid"]).ljust(mw - 1) + "| " + q.get("name", "").ljust(25) + "| "
                       + str(q["memory_mb"]).ljust(memw) + "|")
        out.append(border(p, "="))
    return "\n".join(out)


def live_processes(p, proc_root="/proc"):
    """The node's NPU users, as the real npu-smi lists them from the driver: processes in this node's network
    namespace (its host-network containers share it) that run `vllm serve` with ASCEND_RT_VISIBLE_DEVICES. Each
    holds gpu_memory_utilization of every visible die's HBM (vLLM's budget), as a vLLM engine does."""
    try:
        mine = os.readlink(os.path.join(proc_root, "self", "ns", "net"))
    except OSError:
        return []
    by_logic = dict((chip["logic_id"], (card, chip)) for card, chip in chips(p))
    found = []
    for pid in sorted((e for e in os.listdir(proc_root) if e.isdigit()), key=int):
        base = os.path.join(proc_root, pid)
        try:
            if os.readlink(os.path.join(base, "ns", "net")) != mine:
                continue
            with open(os.path.join(base, "cmdline"), "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
            if "serve" not in argv or not any(a.endswith("vllm") for a in argv):
                continue
            with open(os.path.join(base, "environ"), "rb") as f:
                env = dict(e.decode("utf-8", "replace").split("=", 1) for e in f.read().split(b"\0") if b"=" in e)
            with open(os.path.join(base, "comm")) as f:
                name = f.read().strip()
        except (OSError, ValueError):
            continue
        visible = env.get("ASCEND_RT_VISIBLE_DEVICES")
        if not visible:
            continue
        util = 0.9
        if "--gpu-memory-utilization" in argv[:-1]:
            try:
                util = float(argv[argv.index("--gpu-memory-utilization") + 1])
            except ValueError:
                pass
        for logic in visible.split(","):
            if logic.strip().isdigit() and int(logic) in by_logic:
                card, chip = by_logic[int(logic)]
                found.append({"npu_id": card["npu_id"], "chip_id": chip["chip_id"], "pid": int(pid), "name": name,
                              "memory_mb": int(util * chip["hbm_total_mb"]) - chip["hbm_used_mb"]})
    return found


def with_live_processes(p, proc_root="/proc"):
    """The profile as the driver sees it right now: its own (faulted) process rows plus the live NPU users."""
    live = live_processes(p, proc_root)
    if not live:
        return p
    p = json.loads(json.dumps(p))
    for q in live:
        card = find_card(p, q["npu_id"])
        chip = next(c for c in card["chips"] if c["chip_id"] == q["chip_id"])
        chip["hbm_used_mb"] += q["memory_mb"]
        chip["aicore_pct"] = max(chip.get("aicore_pct", 0), 12)
    p["processes"] = list(p.get("processes", [])) + live
    return p


def info_m(p):
    a3 = p["generation"] == "A3"
    head = ["NPU ID", "Chip ID", "Chip Logic ID"] + (["Chip Phy-ID"] if a3 else []) + ["Chip Name"]
    rows = []
    for card in p["cards"]:
        for chip in card["chips"]:
            r = [card["npu_id"], chip["chip_id"], chip["logic_id"]] + ([chip["phy_id"]] if a3 else [])
            rows.append(r + [chip["long_name"]])
        r = [card["npu_id"], len(card["chips"]), "-"] + (["-"] if a3 else []) + ["Mcu"]
        rows.append(r)
    w = [len(h) + 2 for h in head]
    lines = ["\t" + "".join(h.ljust(x) for h, x in zip(head, w)).rstrip()]
    for r in rows:
        lines.append("\t" + "".join(str(c).ljust(x) for c, x in zip(r, w)).rstrip())
    return "\n".join(lines)


def info_l(p):
    out = ["\tTotal Count                    : %d" % len(p["cards"]), ""]
    for card in p["cards"]:
        out += ["\tNPU ID                         : %s" % card["npu_id"],
                "\tChip Count                     : %d" % len(card["chips"]), ""]
    return "\n".join(out)


def kv(pairs):
    return "\n".join("\t%-30s : %s" % (k, v) for k, v in pairs)


def find_card(p, npu_id):
    for card in p["cards"]:
        if str(card["npu_id"]) == str(npu_id):
            return card
    return None


def typed_info(p, kind, card, chip):
    a3 = p["generation"] == "A3"
    if kind == "board":
        if chip is None:
            return kv([("Product Name", p["product_name"]), ("Model", "NA"), ("Manufacturer", "Huawei"),
                       ("Serial Number", card["serial"]), ("Software Version", p["driver_version"]),
                       ("Firmware Version", p["firmware_version"]), ("Compatibility", "OK"),
                       ("Board ID", "0x%02x" % card.get("board_id", 0x65)), ("PCB ID", "A"),
                       ("BOM ID", "1"), ("PCIe Bus Info", card["chips"][0]["bus_id"]),
                       ("Slot ID", card["npu_id"]), ("Class ID", "NA"), ("PCI Vendor ID", "0x19E5"),
                       ("PCI Device ID", "0xD803" if a3 else "0xD802"), ("PCI Subsystem Vendor ID", "0x19E5"),
                       ("PCI Subsystem ID", "0x3003" if a3 else "0x3000"), ("Chip Count", len(card["chips"]))])
        if a3:
            return kv([("NPU ID", card["npu_id"]), ("NPU Name", p["npu_name"]), ("Chip ID", chip["chip_id"]),
                       ("Chip Name", chip["name"]), ("Chip Type", "Ascend"),
                       ("Chip Phy-ID", chip["phy_id"])])
        return kv([("NPU ID", card["npu_id"]), ("Chip ID", chip["chip_id"]), ("Chip Type", "Ascend"),
                   ("Chip Name", chip["name"])])
    targets = card["chips"] if chip is None else [chip]
    if kind == "health":
        worst = max((c["health"] for c in targets), key=lambda h: ["OK", "Warning", "Alarm", "Critical"].index(h)
                    if h in ("OK", "Warning", "Alarm", "Critical") else 9)
        key = "Health" if chip is None else "Health Status"
        code = "NA" if worst == "OK" else "0x80E01801"
        return kv([("NPU ID", card["npu_id"])] + ([("Chip ID", chip["chip_id"])] if chip else [])
                  + [(key, worst), ("Error Code", code), ("Error Information", "NA" if worst == "OK" else "node "
                                                                                  "alarm injected by npuops_sim")])
    if kind == "usages":
        blocks = []
        for c in targets:
            blocks.append(kv([("DDR Capacity(MB)", 15171), ("DDR Usage Rate(%)", 3),
                              ("DDR Hugepages Total(page)", 0), ("DDR Hugepages Usage Rate(%)", 0),
                              ("HBM Capacity(MB)", c["hbm_total_mb"]),
                              ("HBM Usage Rate(%)", c["hbm_used_mb"] * 100 // c["hbm_total_mb"]),
                              ("Aicore Usage Rate(%)", c.get("aicore_pct", 0)), ("Aivector Usage Rate(%)", 0),
                              ("Aicpu Usage Rate(%)", 0), ("Ctrlcpu Usage Rate(%)", 1),
                              ("DDR Bandwidth Usage Rate(%)", 0), ("HBM Bandwidth Usage Rate(%)", 0),
                              ("Chip ID", c["chip_id"])]))
        return "\n\n".join(blocks)
    if kind == "memory":
        return "\n\n".join(kv([("DDR Capacity(MB)", 15171), ("HBM Capacity(MB)", c["hbm_total_mb"]),
                                ("HBM Clock Speed(MHz)", 1600), ("HBM Temperature(C)", c["temp_c"]),
                                ("Chip ID", c["chip_id"])]) for c in targets)
    if kind == "spod-info":
        if not a3:
            return None
        c = targets[0]
        return kv([("SDID", c.get("sdid", 0)), ("Super Pod Size", p.get("superpod_size", 0)),
                   ("Super Pod ID", p.get("superpod_id", 0)), ("Server Index", p.get("server_index", 0))])
    return None


TYPES = ("board", "health", "usages", "memory", "spod-info")


def render_all(p):
    """Every answer the simulated npu-smi gives, as files the small sh front end prints:
    {"info": text, "info_-m": ..., "info_-l": ..., "t/<type>_<card>[_<chip>]": text}."""
    files = {"info": info_table(p), "info_-m": info_m(p), "info_-l": info_l(p)}
    if any(f.get("fault") == "npu_smi_hang" for f in p.get("faults", [])):
        files["hang"] = "the driver does not answer (fault npu_smi_hang)"
    for card in p["cards"]:
        for kind in TYPES:
            for chip in [None] + card["chips"]:
                text = typed_info(p, kind, card, chip)
                if text is not None:
                    key = "t/%s_%s" % (kind, card["npu_id"]) + ("" if chip is None else "_%s" % chip["chip_id"])
                    files[key] = text
    return dict((k, v + "\n") for k, v in files.items())


def main(argv):
    if not argv or argv[0] != "info":
        print("Usage: npu-smi info [-m | -l | -t <type> -i <card> [-c <chip>]]")
        return 1 if argv else 0
    p = load_profile()
    if p is None:
        print(DCMI_FAIL)
        return 1
    args = argv[1:]
    if not args:
        print(info_table(with_live_processes(p)))
        return 0
    if args == ["-m"]:
        print(info_m(p))
        return 0
    if args == ["-l"]:
        print(info_l(p))
        return 0
    opts = {}
    i = 0
    while i < len(args):
        if args[i] in ("-t", "-i", "-c") and i + 1 < len(args):
            opts[args[i]] = args[i + 1]
            i += 2
        else:
            print("Error: invalid parameter %s" % args[i])
            return 2
    if "-t" not in opts or "-i" not in opts:
        print("Error: -t and -i are required")
        return 2
    card = find_card(p, opts["-i"])
    if card is None:
        print("Error: card id %s is invalid." % opts["-i"])
        return 2
    chip = None
    if "-c" in opts:
        chip = next((c for c in card["chips"] if str(c["chip_id"]) == opts["-c"]), None)
        if chip is None:
            print("Error: chip id %s is invalid." % opts["-c"])
            return 2
    text = typed_info(p, opts["-t"], card, chip)
    if text is None:
        print("This device does not support querying %s." % opts["-t"])
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
