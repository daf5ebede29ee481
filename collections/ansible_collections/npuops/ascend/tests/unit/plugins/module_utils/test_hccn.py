# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import itertools

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import hccn

# verbatim outputs (vllm-ascend installation.md "Verify Multi-Node Communication", Ascend/msit msprechecker)
PING_OK = ("device 0 PING 11.12.165.80\nrecv seq=0,time=0.114000ms\nrecv seq=1,time=0.104000ms\n"
           "recv seq=2,time=0.098000ms\n3 packets transmitted, 3 received, 0.00% packet loss\n")
HCCS_OK = ("device 0 PING 192.168.2.199\nThis pkt ping success!\nrecv seq 0, time = 12.500us, L1 plane check "
           "result = 0x0\nThis pkt ping success!\nrecv seq 1, time = 11.500us, L1 plane check result = 0x0\n"
           "2 packets transmitted, 2 received, 0.00% packets loss\n"
           "max time = 12.500us, min time = 11.500us, average time = 12.000us, TP95 time = 12.500us\n")
TLS = ("dev_id:0, tls switch[0](0:disable, 1:enable), tls preconfigured[1](0:non-preset, 1:preset), "
       "tls alarm time threshold[60]days")


def test_get_items():
    assert hccn.parse_link("link status: UP\n") == "UP"
    assert hccn.parse_link("link status: DOWN") == "DOWN"
    assert hccn.parse_net_health("net health status: Success") == "Success"
    assert hccn.parse_net_health("net health status: Receive timeout") == "Receive timeout"
    assert hccn.parse_netdetect("netdetect address: 11.12.165.1") == "11.12.165.1"
    assert hccn.parse_gateway("default gateway:11.12.165.1, Iface:eth0") == "11.12.165.1"
    assert hccn.parse_ip("ipaddr:11.12.165.80\nnetmask:255.255.255.0") == ("11.12.165.80", "255.255.255.0")
    assert hccn.parse_ip("no ip was preset") == (None, None)
    assert hccn.parse_vnic("vnic link status: UP\nvnic ipaddr: 192.168.2.199\nvnic netmask: 255.255.255.0") == \
        {"status": "UP", "ipaddr": "192.168.2.199", "netmask": "255.255.255.0"}
    assert hccn.parse_vnic("This device does not support this function.") is None
    assert hccn.parse_tls(TLS) == 0
    assert hccn.parse_tls(TLS.replace("switch[0]", "switch[1]")) == 1


def test_ping_formats():
    assert hccn.parse_ping(PING_OK) == {"ok": True, "transmitted": 3, "received": 3, "loss_pct": 0.0, "rtt_ms": 0.105}
    r = hccn.parse_ping(HCCS_OK)
    assert r["ok"] and r["received"] == 2 and r["rtt_ms"] == 0.012
    partial = PING_OK.replace("3 received, 0.00%", "2 received, 33.33%")
    assert hccn.parse_ping(partial)["ok"] is False
    assert hccn.parse_ping("3 packets transmitted, 0 received, 100.00% packet loss")["ok"] is False
    assert hccn.parse_ping(HCCS_OK.replace("result = 0x0", "result = 0x3", 1))["ok"] is False
    assert hccn.parse_ping(HCCS_OK.replace("This pkt ping success!", "This pkt send fail!", 1))["ok"] is False
    assert hccn.parse_ping("socket error")["ok"] is False


class FakeTool:
    """hccn_tool answering from a dict of device states, recording every call."""

    def __init__(self, devices, reachable=(), hccs=False):
        self.devices = devices
        self.reachable = set(reachable)
        self.hccs = hccs
        self.calls = []

    def __call__(self, argv, timeout):
        self.calls.append(argv)
        phy, item = int(argv[2]), argv[3]
        d = self.devices.get(phy)
        if d is None:
            return 1, "Invalid device id %d" % phy
        if item == "-link":
            return 0, "link status: %s" % d.get("link", "UP")
        if item == "-net_health":
            return 0, "net health status: %s" % d.get("net_health", "Success")
        if item == "-ip":
            return (0, "ipaddr:%s\nnetmask:255.255.240.0" % d["ip"]) if d.get("ip") else (13, "no ip was preset")
        if item == "-vnic":
            return 0, "vnic link status: UP\nvnic ipaddr: 10.9.0.%d\nvnic netmask: 255.255.255.0" % phy
        if item == "-tls":
            return 0, TLS.replace("switch[0]", "switch[%d]" % d.get("tls", 0))
        if item == "-gateway":
            return 0, "default gateway:10.0.15.254, Iface:eth%d" % phy
        if item == "-netdetect":
            return 0, "netdetect address: 10.0.15.254"
        if item == "-hccs_ping":
            if not self.hccs:
                return 1, "This device does not support this function."
            return 0, HCCS_OK
        if item == "-ping":
            if argv[-1] in self.reachable and d.get("link", "UP") == "UP":
                return 0, PING_OK
            return 1, "device %d PING %s\n3 packets transmitted, 0 received, 100.00%% packet loss" % (phy, argv[-1])
        return 1, "unsupported"


def test_check_reports_every_failure_with_its_device_and_fix():
    devices = {0: {"ip": "10.0.0.1"}, 1: {"ip": "10.0.0.2", "link": "DOWN"}, 2: {"ip": "", "net_health": "Init"}}
    tool = FakeTool(devices, reachable={"10.0.1.1"})
    targets = {0: ["10.0.1.1"], 1: ["10.0.1.1"], 2: ["10.0.1.9"]}
    devs, rows, problems, method = hccn.check(tool, "hccn_tool", [0, 1, 2], targets)
    assert method == "ping"  # hccs_ping not supported on a standalone A3
    assert [d["phy_id"] for d in devs] == [0, 1, 2]
    assert devs[0] == {"phy_id": 0, "link": "UP", "net_health": "Success", "ipaddr": "10.0.0.1",
                       "netmask": "255.255.240.0", "vnic_ipaddr": "10.9.0.0", "tls_switch": 0,
                       "gateway": "10.0.15.254", "netdetect": "10.0.15.254"}
    found = sorted((p["check"], p["phy_id"]) for p in problems)
    assert found == [("ip", 2), ("link", 1), ("net_health", 2), ("ping", 1), ("ping", 2)]
    link = [p for p in problems if p["check"] == "link"][0]
    assert link["observed"] == "link status: DOWN" and link["expected"] == "link status: UP"
    assert "-lldp" in link["fix"]
    assert [r["ok"] for r in rows] == [True, False, False]


def test_pings_run_one_at_a_time_per_device_and_all_devices_in_parallel():
    import threading
    import time as _time
    active = {}
    peak = {"per_device": 0, "devices": 0}
    lock = threading.Lock()

    def tool(argv, timeout):
        if argv[3] != "-ping":
            return FakeTool({int(argv[2]): {"ip": "10.0.0.1"}})(argv, timeout)
        phy = int(argv[2])
        with lock:
            active[phy] = active.get(phy, 0) + 1
            peak["per_device"] = max(peak["per_device"], active[phy])
            peak["devices"] = max(peak["devices"], sum(1 for v in active.values() if v))
        _time.sleep(0.02)
        with lock:
            active[phy] -= 1
        return 0, PING_OK

    targets = {phy: ["10.0.1.%d" % i for i in range(4)] for phy in range(8)}
    hccn.check(tool, "hccn_tool", list(range(8)), targets, ping_method="ping")
    assert peak["per_device"] == 1
    assert peak["devices"] > 1


def test_auto_uses_hccs_ping_where_the_board_supports_it():
    tool = FakeTool({0: {"ip": "10.0.0.1"}}, hccs=True)
    _devs, rows, problems, method = hccn.check(tool, "hccn_tool", [0], {0: ["10.9.1.1"]})
    assert method == "hccs_ping" and rows[0]["ok"] and problems == []


def test_budget_bounds_the_pings():
    tool = FakeTool({0: {"ip": "10.0.0.1"}}, reachable={"10.0.1.1"})
    targets = {0: ["10.0.1.1"] * 3}
    _devs, rows, problems, _method = hccn.check(tool, "hccn_tool", [0], targets, ping_method="ping", budget=-1)
    assert all(not r["ok"] and "time budget" in r["detail"] for r in rows)
    assert len(problems) == 3


def test_a_tool_that_does_not_answer_is_one_clear_failure():
    tool = FakeTool({})
    _devs, _rows, problems, _method = hccn.check(tool, "hccn_tool", [5], {})
    assert problems == [{"check": "query", "phy_id": 5, "observed": "Invalid device id 5",
                         "expected": "hccn_tool answers", "fix": hccn.FIX["query"].format(phy=5)}]


def test_run_command_is_bounded():
    rc, out = hccn.run_command(["sleep", "5"], timeout=0.2)
    assert rc == -9 and "killed" in out
    assert hccn.run_command(["/nonexistent/hccn_tool"], timeout=1)[0] == 127


def test_hccn_conf():
    conf = hccn.parse_hccn_conf("address_0=29.1.137.205\nnetmask_0=255.255.0.0\nnetdetect_0=29.1.0.1\n"
                                "gateway_0=29.1.0.1\nsend_arp_status_0=1\ntls_enable_0=0\naddress_1=29.1.137.206\n")
    assert conf[0] == {"address": "29.1.137.205", "netmask": "255.255.0.0", "netdetect": "29.1.0.1",
                       "gateway": "29.1.0.1", "send_arp_status": "1", "tls_enable": "0"}
    assert conf[1] == {"address": "29.1.137.206"}


def cluster(nodes, devices):
    return {"node%02d" % n: {d: "10.%d.%d.%d" % (n // 250, n % 250, d + 1) for d in range(devices)}
            for n in range(nodes)}


@pytest.mark.parametrize("nodes,devices", [(2, 16), (4, 16), (16, 16), (16, 8), (3, 1)])
def test_sample_mesh_covers_every_device_and_every_node_pair(nodes, devices):
    addrs = cluster(nodes, devices)
    owner = {a: (h, p) for h, devs in addrs.items() for p, a in devs.items()}
    plan = hccn.plan_mesh(addrs, "sample")
    pinged, pairs = set(), set()
    for host, per_device in plan.items():
        assert sorted(per_device) == sorted(addrs[host])  # every device sends
        for targets in per_device.values():
            assert targets and len(targets) == -(-(nodes - 1) // devices)
            for t in targets:
                peer = owner[t][0]
                assert peer != host
                pinged.add(t)
                pairs.add((host, peer))
    assert pinged == set(owner)  # every device is reached by another node
    assert pairs == set(itertools.permutations(addrs, 2))


def test_sample_mesh_keeps_per_node_work_constant_as_the_cluster_grows():
    per_node = [sum(len(t) for t in hccn.plan_mesh(cluster(n, 16))["node00"].values()) for n in (2, 4, 16)]
    assert per_node == [16, 16, 16]


def test_full_mesh_reaches_every_other_node_from_every_device():
    addrs = cluster(4, 16)
    owner = {a: h for h, devs in addrs.items() for a in devs.values()}
    plan = hccn.plan_mesh(addrs, "full")
    for host, per_device in plan.items():
        for targets in per_device.values():
            assert sorted(owner[t] for t in targets) == sorted(h for h in addrs if h != host)
    assert len({t for p in plan.values() for ts in p.values() for t in ts}) == 64


def test_mesh_of_one_node_is_empty():
    assert hccn.plan_mesh(cluster(1, 16)) == {"node00": {}}
