"""The per-node hardware profile the fake tools print from, and the faults that change it.

Pure functions over plain dicts: `build()` makes a healthy node, `apply_fault()` / `clear_faults()`
change it. The cluster code writes the result where the node's driver state lives and performs the
matching real effect (an address removed, a route blocked, a file deleted) for network/file faults.
"""
import copy
import time

DRIVER_VERSION = "25.5.1"
OLD_DRIVER_VERSION = "24.1.rc3.7"  # too old for the CANN 9.x images (vllm-ascend#5468)
FIRMWARE_VERSION = "7.8.0.6.201"
CANN_VERSION = "9.1.0"

# Bus numbers of an Atlas 800 A3 as printed in public npu-smi dumps (vllm-ascend#2035), card by card.
A3_BUSES = ["9D", "9F", "99", "9B", "B9", "BB", "B5", "B7", "1D", "1F", "19", "1B", "39", "3B", "35", "37"]
A2_BUSES = ["C1", "C2", "81", "82", "01", "02", "41", "42"]

NODE_FAULTS = ("hccn_conf_missing", "old_driver", "no_shm", "port_busy", "jemalloc_preload", "old_mooncake")
# Faults of a running node, set and cleared while the service runs: the node's links cut (unreachable), the
# engine process frozen (SIGSTOP: nothing answers), the engine wedged (its API answers, /health 200, but no
# token comes out), the weight server frozen, npu-smi hanging in the driver.
RUNTIME_FAULTS = ("node_down", "engine_hang", "engine_wedge", "relay_hang", "npu_smi_hang", "garbled", "nonfinite")
DEVICE_FAULTS = ("link_down", "net_health_init", "tls_mismatch", "chip_warning", "chip_alarm", "hbm_busy")
PAIR_FAULTS = ("fabric_cut",)
FAULTS = NODE_FAULTS + DEVICE_FAULTS + PAIR_FAULTS + RUNTIME_FAULTS


def build(node, generation, plan, superpod=False):
    """A healthy node profile. `node` is a plan.NodeSpec, `generation` 'a3' or 'a2'."""
    a3 = generation == "a3"
    chips_per_card = 2 if a3 else 1
    cards = []
    for card in range(8):
        chips = []
        for chip in range(chips_per_card):
            phy = card * chips_per_card + chip
            buses = A3_BUSES if a3 else A2_BUSES
            chips.append({
                "chip_id": chip,
                "logic_id": phy,
                "phy_id": phy,
                "name": "Ascend910" if a3 else "910B3",
                "long_name": "Ascend910" if a3 else "Ascend 910B3",
                "bus_id": "0000:%s:00.0" % buses[phy],
                "health": "OK",
                # only chip 0 of an A3 card reports power; idle HBM use is ~3.2-3.4 GB per die
                "power_w": round(170.0 + 2.3 * card + 0.7 * node.index, 1) if chip == 0 else None,
                "temp_c": 34 + (card + node.index) % 5,
                "hbm_used_mb": 3186 + (phy * 37 + node.index * 11) % 230,
                "hbm_total_mb": 65536,
                "aicore_pct": 0,
                "sdid": (node.index << 16) + phy if superpod else 0,
            })
        cards.append({"npu_id": card, "serial": "102%03d%04d" % (node.index, card), "chips": chips})
    devices = {}
    for d in node.devices:
        devices[str(d["phy_id"])] = {
            "ip": d["ip"],
            "netmask": plan.fabric_netmask(),
            "vnic_ip": d["vnic_ip"],
            "vnic_netmask": "255.255.255.0",
            "link": "UP",
            "net_health": "Success",
            "netdetect": plan.fabric_gateway(),
            "gateway": plan.fabric_gateway(),
            "tls_switch": 0,
            "speed_mbps": 400000 if a3 else 200000,
            "lldp_port": "400GE1/%d/%d:1" % (node.index, d["phy_id"] + 1),
        }
    return {
        "generation": "A3" if a3 else "A2",
        "node": node.name,
        "product_name": "Atlas 800 A3" if a3 else "Atlas 800T A2",
        "npu_name": "9392" if a3 else "",
        "npu_smi_version": DRIVER_VERSION,
        "driver_version": DRIVER_VERSION,
        "firmware_version": FIRMWARE_VERSION,
        "cann_version": CANN_VERSION,
        "superpod": bool(superpod),
        "superpod_size": 384 if superpod else 0,
        "server_index": node.index - 1,
        "table_style": "classic",
        "cards": cards,
        "processes": [],
        "devices": devices,
        "faults": [],
    }


def chip_by_phy(profile, phy_id):
    for card in profile["cards"]:
        for chip in card["chips"]:
            if chip["phy_id"] == phy_id:
                return card, chip
    raise KeyError("no chip with physical id %d on %s" % (phy_id, profile["node"]))


def apply_fault(profile, fault, device=None, **extra):
    """Return a copy of `profile` with `fault` recorded and its effect on what the tools print."""
    if fault not in FAULTS:
        raise ValueError("unknown fault %r; known: %s" % (fault, ", ".join(FAULTS)))
    if fault in DEVICE_FAULTS and device is None:
        raise ValueError("fault %s needs DEVICE=<physical id>" % fault)
    p = copy.deepcopy(profile)
    if device is not None and str(device) not in p["devices"]:
        raise ValueError("%s has no device %s" % (p["node"], device))
    dev = p["devices"].get(str(device)) if device is not None else None
    if fault == "link_down":
        dev["link"] = "DOWN"
        dev["net_health"] = "Receive timeout"
    elif fault == "net_health_init":
        dev["net_health"] = "Init"
    elif fault == "tls_mismatch":
        dev["tls_switch"] = 1
    elif fault in ("chip_warning", "chip_alarm"):
        chip_by_phy(p, int(device))[1]["health"] = "Warning" if fault == "chip_warning" else "Alarm"
    elif fault == "hbm_busy":
        card, chip = chip_by_phy(p, int(device))
        chip["hbm_used_mb"] = 58959
        chip["aicore_pct"] = 37
        p["processes"].append({"npu_id": card["npu_id"], "chip_id": chip["chip_id"],
                               "pid": extra.get("pid", 2268921), "name": "python3", "memory_mb": 55600})
    elif fault == "old_driver":
        p["driver_version"] = p["npu_smi_version"] = OLD_DRIVER_VERSION
    record = {"fault": fault}
    if fault == "engine_wedge":
        # a hung collective wedges the engines that run now; one started later (a restart) is not wedged
        record["at"] = time.time()
    if device is not None:
        record["device"] = int(device)
    record.update({k: v for k, v in extra.items() if v is not None})
    p["faults"].append(record)
    return p


def clear_faults(profile, healthy):
    """Back to the healthy profile (faults of every kind removed)."""
    p = copy.deepcopy(healthy)
    p["faults"] = []
    return p


def version_info(profile):
    """/usr/local/Ascend/driver/version.info as the driver package writes it."""
    v = profile["driver_version"]
    return ("Version=%s\nascendhal_version=7.35.23\naicpu_version=1.0\ntdt_version=1.0\nlog_version=1.0\n"
            "prof_version=2.0\ndvppkernels_version=1.1\ntsfw_version=1.0\nInnerversion=V100R001C25SPC001B210\n"
            "compatible_version=[V100R001C15],[V100R001C17],[V100R001C18],[V100R001C19],[V100R001C20],"
            "[V100R001C21],[V100R001C23],[V100R001C25]\ncompatible_version_fw=[7.0.0,7.8.99]\n"
            "package_version=%s\n" % (v, v))


def ascend_install_info():
    return ("UserName=HwHiAiUser\nUserGroup=HwHiAiUser\nDriver_Install_Type=full\n"
            "Driver_Install_Path_Param=/usr/local/Ascend\nDriver_Install_For_All=no\nDriver_Install_Mode=normal\n"
            "Firmware_Install_Type=full\nFirmware_Install_Path_Param=/usr/local/Ascend\n")


def toolkit_install_info(profile):
    return ("package_name=Ascend-cann-toolkit\nversion=%s\ninnerversion=V100R001C25SPC001B210\narch=x86_64\n"
            "os=linux\npath=/usr/local/Ascend/ascend-toolkit/%s/x86_64-linux\n"
            % (profile["cann_version"], profile["cann_version"]))


NOT_SUPPORTED = "This device does not support this function."


def render_hccn(profile):
    """What `hccn_tool -i N -<item> -g` prints per device, as files {"N/item": text, "N/item.rc": code}.

    The simulated hccn_tool is a small sh script that prints these (the real one is a binary that asks
    the driver); `N/address` is the source address its -ping uses."""
    a3 = profile["generation"] == "A3"
    files = {}
    for phy, d in profile["devices"].items():
        items = {
            "address": d["ip"],
            "link": "link status: %s" % d["link"],
            "net_health": "net health status: %s" % d["net_health"],
            "netdetect": "netdetect address: %s" % d["netdetect"],
            "gateway": "default gateway:%s, Iface:eth%s" % (d["gateway"], phy),
            "ip": "ipaddr:%s\nnetmask:%s" % (d["ip"], d["netmask"]),
            "tls": "dev_id:%s, tls switch[%d](0:disable, 1:enable), tls preconfigured[1](0:non-preset, "
                   "1:preset), tls alarm time threshold[60]days" % (phy, d["tls_switch"]),
            "lldp": "Chassis ID TLV\n\tMAC: ac:75:1d:00:00:%02x\nPort ID TLV\n\tIfname: %s\n"
                    "Time to Live TLV\n\t121" % (int(phy), d["lldp_port"]),
            "speed": "Speed: %d Mb/s" % d["speed_mbps"],
            "vnic": ("vnic link status: %s\nvnic ipaddr: %s\nvnic netmask: %s" % (d["link"], d["vnic_ip"],
                                                                                 d["vnic_netmask"]))
            if a3 else NOT_SUPPORTED,
        }
        for item, text in items.items():
            files["%s/%s" % (phy, item)] = text + "\n"
        if not a3:
            files["%s/vnic.rc" % phy] = "1\n"
    if profile.get("superpod"):
        files["superpod"] = "1\n"
    if profile.get("ping_interval"):
        files["ping_interval"] = "%s\n" % profile["ping_interval"]
    return files


def hccn_conf(profile):
    """/etc/hccn.conf: the persistent store hccn_tool -s writes, indexed by physical device id."""
    lines = []
    for phy in sorted(profile["devices"], key=int):
        d = profile["devices"][phy]
        lines += ["address_%s=%s" % (phy, d["ip"]), "netmask_%s=%s" % (phy, d["netmask"]),
                  "netdetect_%s=%s" % (phy, d["netdetect"]), "gateway_%s=%s" % (phy, d["gateway"]),
                  "send_arp_status_%s=1" % phy, "tls_enable_%s=%s" % (phy, d["tls_switch"])]
    return "\n".join(lines) + "\n"
