# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""hccn_tool: parse its output, query devices in parallel, plan and run the cross-node ping mesh.

Formats: vllm-ascend installation.md "Verify Multi-Node Communication" and Ascend/msit msprechecker's parsers.
``hccn_tool -i`` takes the *physical* device id. Each check that fails is
reported as ``{check, phy_id, observed, expected, fix}``. Standard library only: this runs on the nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import time

from ansible_collections.npuops.ascend.plugins.module_utils import proc, workers

NOT_SUPPORTED = "does not support this function"
DEFAULT_HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"

FIX = {
    "link": "check the optical module, the cable and the switch port of device {phy} "
            "(hccn_tool -i {phy} -lldp -g names the switch port); the link must be UP",
    "net_health": "net_health probes the netdetect address: set it to a reachable gateway "
                  "(hccn_tool -i {phy} -netdetect -s address <gateway>); Init usually means it is unset or unreachable",
    "ip": "give device {phy} its fabric address: hccn_tool -i {phy} -ip -s address <ip> netmask <mask> "
          "(and keep /etc/hccn.conf in step)",
    "vnic": "the A3 vNIC of device {phy} must be UP with an address (hccn_tool -i {phy} -vnic -g)",
    "ping": "device {phy} cannot reach {target}: check the link, address and route of both devices, the switch "
            "ports between them, and that TLS is the same on both",
    "query": "hccn_tool -i {phy} failed; run it by hand as root to see why (is the driver loaded?)",
}


def _after_colon(text, key):
    m = re.search(r"%s\s*:\s*(\S[^\n,]*)" % re.escape(key), text)
    return m.group(1).strip() if m else None


def parse_link(text):
    return _after_colon(text, "link status")


def parse_net_health(text):
    return _after_colon(text, "net health status")


def parse_netdetect(text):
    return _after_colon(text, "netdetect address")


def parse_gateway(text):
    m = re.search(r"default gateway\s*:\s*([^,\s]+)", text)
    return m.group(1) if m else None


def parse_ip(text):
    """-> (ipaddr, netmask); (None, None) when no address is set ("no ip was preset", rc 13)."""
    return _after_colon(text, "ipaddr"), _after_colon(text, "netmask")


def parse_vnic(text):
    if NOT_SUPPORTED in text:
        return None
    return {"status": _after_colon(text, "vnic link status"), "ipaddr": _after_colon(text, "vnic ipaddr"),
            "netmask": _after_colon(text, "vnic netmask")}


def parse_tls(text):
    m = re.search(r"tls switch\[(\d+)\]", text)
    return int(m.group(1)) if m else None


_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received, ([\d.]+)% packets? loss")
_RTT_MS = re.compile(r"time=([\d.]+)ms")
_RTT_US = re.compile(r"time = ([\d.]+)us")


def parse_ping(text):
    """`-ping` and `-hccs_ping` output -> {ok, transmitted, received, loss_pct, rtt_ms}.

    hccs_ping says "packets loss" and reports microseconds; a non-zero L1 plane check result or a
    "This pkt ... fail" line is a failure even when a summary claims otherwise.
    """
    m = _SUMMARY.search(text)
    if not m:
        return {"ok": False, "transmitted": 0, "received": 0, "loss_pct": 100.0, "rtt_ms": None}
    sent, got, loss = int(m.group(1)), int(m.group(2)), float(m.group(3))
    rtts = [float(x) for x in _RTT_MS.findall(text)] + [float(x) / 1000.0 for x in _RTT_US.findall(text)]
    l1_bad = any(int(x, 16) != 0 for x in re.findall(r"L1 plane check result = (0x[0-9a-fA-F]+)", text))
    pkt_fail = re.search(r"This pkt (send fail|ping not start to send|check recv msg fail)", text) is not None
    ok = got > 0 and loss == 0.0 and not l1_bad and not pkt_fail
    return {"ok": ok, "transmitted": sent, "received": got, "loss_pct": loss,
            "rtt_ms": round(sum(rtts) / len(rtts), 3) if rtts else None}


def run_command(argv, timeout):
    """The command bounded by `timeout` -> (rc, stdout+stderr); rc proc.TIMED_OUT (-9) when it had to be killed."""
    rc, out, err = proc.run(argv, timeout)
    return rc, out + err


def failed(check, phy, observed, expected, **fmt):
    return {"check": check, "phy_id": phy, "observed": observed, "expected": expected,
            "fix": FIX[check].format(phy=phy, **fmt)}


def query_device(run, tool, phy, vnic=True, timeout=10):
    """All `-g` items of one device -> (device dict, failed checks)."""
    def get(item):
        rc, out = run([tool, "-i", str(phy), "-%s" % item, "-g"], timeout)
        return rc, out

    dev = {"phy_id": phy}
    problems = []
    rc, out = get("link")
    dev["link"] = parse_link(out)
    if dev["link"] is None and rc != 0:
        return dev, [failed("query", phy, out.strip()[-200:], "hccn_tool answers")]
    rc, out = get("net_health")
    dev["net_health"] = parse_net_health(out)
    rc, out = get("ip")
    dev["ipaddr"], dev["netmask"] = parse_ip(out)
    dev["vnic_ipaddr"] = None
    if vnic:
        rc, out = get("vnic")
        v = parse_vnic(out)
        if v is not None:
            dev["vnic_ipaddr"] = v["ipaddr"]
            if v["status"] != "UP" or not v["ipaddr"]:
                problems.append(failed("vnic", phy, "vnic %s %s" % (v["status"], v["ipaddr"]), "vnic UP with an address"))
    rc, out = get("tls")
    dev["tls_switch"] = parse_tls(out)
    rc, out = get("gateway")
    dev["gateway"] = parse_gateway(out)
    rc, out = get("netdetect")
    dev["netdetect"] = parse_netdetect(out)
    if dev["link"] != "UP":
        problems.append(failed("link", phy, "link status: %s" % dev["link"], "link status: UP"))
    if dev["net_health"] != "Success":
        problems.append(failed("net_health", phy, "net health status: %s" % dev["net_health"],
                               "net health status: Success"))
    if not dev["ipaddr"]:
        problems.append(failed("ip", phy, "no ip was preset", "an ipaddr on the device"))
    return dev, problems


def ping_device(run, tool, phy, targets, method, timeout=15, deadline=None):
    """Ping `targets` from device `phy`, one at a time (hccn_tool allows one ping per device at once)."""
    rows = []
    for target in targets:
        if deadline is not None and time.monotonic() > deadline:
            rows.append({"phy_id": phy, "target": target, "ok": False, "loss_pct": None, "rtt_ms": None,
                         "method": method, "detail": "not run: the check's time budget ran out"})
            continue
        rc, out = run([tool, "-i", str(phy), "-%s" % method, "-g", "address", target], timeout)
        res = parse_ping(out)
        rows.append({"phy_id": phy, "target": target, "ok": res["ok"], "loss_pct": res["loss_pct"],
                     "rtt_ms": res["rtt_ms"], "method": method,
                     "detail": "%d/%d received" % (res["received"], res["transmitted"]) if res["transmitted"]
                     else out.strip().splitlines()[-1][:200] if out.strip() else "rc=%s" % rc})
    return rows


def check(run, tool, devices, ping_targets=None, ping_method="auto", vnic=True, budget=120.0):
    """Query every device and ping its targets, devices in parallel. -> (devices, ping rows, failed checks).

    `ping_targets`: {phy_id: [address, ...]}. `ping_method`: ping | hccs_ping | auto (hccs_ping where the
    board supports it — A3 SuperPoD — else ping).
    """
    deadline = time.monotonic() + budget
    ping_targets = ping_targets or {}
    method = ping_method
    if method == "auto":
        method = "ping"
        probe = next(((p, t[0]) for p, t in sorted(ping_targets.items()) if t), None)
        if probe is not None:
            rc, out = run([tool, "-i", str(probe[0]), "-hccs_ping", "-g", "address", probe[1]], 15)
            if NOT_SUPPORTED not in out:
                method = "hccs_ping"

    def job(phy):
        def inner():
            dev, problems = query_device(run, tool, phy, vnic=vnic)
            rows = ping_device(run, tool, phy, ping_targets.get(phy, []), method, deadline=deadline)
            for row in rows:
                if not row["ok"]:
                    problems.append(failed("ping", phy, "%s to %s: %s" % (method, row["target"], row["detail"]),
                                           "0% loss", target=row["target"]))
            return dev, rows, problems
        return inner

    results = workers.for_each([job(phy) for phy in devices], lambda job_fn: job_fn(), len(devices) or 1)
    devs, rows, problems = [], [], []
    for dev, r, p in results:
        devs.append(dev)
        rows.extend(r)
        problems.extend(p)
    return devs, rows, problems, method


def parse_hccn_conf(text):
    """/etc/hccn.conf -> {phy_id: {address, netmask, netdetect, gateway, tls_enable, ...}}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([a-z_]+?)_(\d+)\s*=\s*(\S+)\s*$", line)
        if m:
            out.setdefault(int(m.group(2)), {})[m.group(1)] = m.group(3)
    return out


def plan_mesh(addresses, mode="sample"):
    """Who pings whom. `addresses`: {host: {phy_id: address}} (from each node's hccn.conf).

    -> {host: {phy_id: [target address, ...]}}.

    ``full``: every device pings one device of every other node (D x (N-1) pings per node), rotating the
    target device so every device of every node is also pinged.
    ``sample`` (default): every device pings ceil((N-1)/D) peers; device d of node i pings node
    i+1+((d + r*D) mod (N-1)), device d of that node. Every device sends and receives at least one ping,
    every ordered node pair is covered, and the per-node work does not grow with the cluster — 16 pings
    per A3 node whether the cluster has 2 or 16 nodes.
    """
    hosts = sorted(addresses)
    n = len(hosts)
    plan = {h: {} for h in hosts}
    if n < 2:
        return plan
    for i, host in enumerate(hosts):
        devices = sorted(addresses[host])
        d_count = len(devices)
        if mode == "full":
            for k, phy in enumerate(devices):
                targets = []
                for step in range(1, n):
                    peer = hosts[(i + step) % n]
                    peer_devs = sorted(addresses[peer])
                    if peer_devs:
                        targets.append(addresses[peer][peer_devs[(k + i) % len(peer_devs)]])
                plan[host][phy] = targets
            continue
        rounds = max(1, -(-(n - 1) // max(d_count, 1)))
        for k, phy in enumerate(devices):
            targets = []
            for r in range(rounds):
                step = 1 + ((k + r * d_count) % (n - 1))
                peer = hosts[(i + step) % n]
                peer_devs = sorted(addresses[peer])
                if peer_devs:
                    targets.append(addresses[peer][peer_devs[k % len(peer_devs)]])
            plan[host][phy] = targets
    return plan
