#!/usr/bin/python3
"""Simulated `hccn_tool` for the npuops test cluster (test infrastructure, not a product).

Answers from the node's profile (the device state the real tool reads from the driver) in the formats
of ../shared/reference/ascend-facts.md section 2.2. `-ping` really probes: it sends ICMP echo requests
from the device's fabric address, so a device whose link the simulator cut, or a fabric route it
blocked, really loses the packets. Runs as root, like the real tool. Standard library only.
"""
import json
import os
import select
import socket
import struct
import sys
import time

PROFILE = os.environ.get("NPUOPS_SIM_PROFILE", "/usr/local/Ascend/driver/lib64/npuops_sim/profile.json")
NOT_SUPPORTED = "This device does not support this function."


def load_profile():
    with open(PROFILE) as f:
        return json.load(f)


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def echo(src, dst, seq, ident, timeout):
    """One ICMP echo from src to dst; returns the round trip in ms, or None when nothing came back."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    except OSError:
        return None
    try:
        try:
            sock.bind((src, 0))
        except OSError:
            return None  # the device's address is gone: its link is down
        payload = struct.pack("!d", time.time()) + b"npuops-sim" * 4
        header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
        packet = struct.pack("!BBHHH", 8, 0, checksum(header + payload), ident, seq) + payload
        start = time.monotonic()
        try:
            sock.sendto(packet, (dst, 0))
        except OSError:
            return None  # e.g. the route to the peer is prohibited (a cut fabric)
        deadline = start + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                return None
            data, addr = sock.recvfrom(2048)
            ihl = (data[0] & 0x0F) * 4
            typ, _code, _ck, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
            if typ == 0 and rid == ident and rseq == seq and addr[0] == dst:
                return (time.monotonic() - start) * 1000.0
    finally:
        sock.close()


def ping(dev_id, device, target, count, hccs):
    ident = (os.getpid() + dev_id * 257) & 0xFFFF
    print("device %d PING %s" % (dev_id, target))
    received = 0
    times = []
    for seq in range(count):
        rtt = echo(device["ip"], target, seq, ident, timeout=1.0)
        if rtt is None:
            print("This pkt send fail!" if hccs else "recv time out seq=%d" % seq)
        else:
            received += 1
            times.append(rtt)
            if hccs:
                print("This pkt ping success!")
                print("recv seq %d, time = %.3fus, L1 plane check result = 0x0" % (seq, rtt * 1000))
            else:
                print("recv seq=%d,time=%.6fms" % (seq, rtt))
        if seq + 1 < count:
            time.sleep(0.02)
    loss = 100.0 * (count - received) / count
    if hccs:
        print("%d packets transmitted, %d received, %.2f%% packets loss" % (count, received, loss))
        if times:
            print("max time = %.3fus, min time = %.3fus, average time = %.3fus, TP95 time = %.3fus"
                  % (max(times) * 1000, min(times) * 1000, sum(times) / len(times) * 1000,
                     sorted(times)[int(0.95 * (len(times) - 1))] * 1000))
    else:
        print("%d packets transmitted, %d received, %.2f%% packet loss" % (count, received, loss))
    return 0 if received else 1


def main(argv):
    if len(argv) < 3 or argv[0] != "-i":
        print("Usage: hccn_tool -i <device_id> -<item> -g|-s ...")
        return 1
    try:
        dev_id = int(argv[1])
    except ValueError:
        print("Invalid device id %s" % argv[1])
        return 1
    p = load_profile()
    device = p["devices"].get(str(dev_id))
    if device is None:
        print("Invalid device id %d" % dev_id)
        return 1
    item, rest = argv[2], argv[3:]
    if rest[:1] != ["-g"]:
        print("Only -g (get) is supported by the simulator")
        return 1
    rest = rest[1:]
    if item == "-link":
        print("link status: %s" % device["link"])
    elif item == "-net_health":
        print("net health status: %s" % device["net_health"])
    elif item == "-netdetect":
        print("netdetect address: %s" % device["netdetect"])
    elif item == "-gateway":
        print("default gateway:%s, Iface:eth%d" % (device["gateway"], dev_id))
    elif item == "-ip":
        if not device.get("ip"):
            print("no ip was preset")
            return 13
        print("ipaddr:%s" % device["ip"])
        print("netmask:%s" % device["netmask"])
    elif item == "-vnic":
        if p["generation"] != "A3":
            print(NOT_SUPPORTED)
            return 1
        print("vnic link status: %s" % device["link"])
        print("vnic ipaddr: %s" % device["vnic_ip"])
        print("vnic netmask: %s" % device["vnic_netmask"])
    elif item == "-tls":
        print("dev_id:%d, tls switch[%d](0:disable, 1:enable), tls preconfigured[1](0:non-preset, 1:preset), "
              "tls alarm time threshold[60]days" % (dev_id, device["tls_switch"]))
    elif item == "-lldp":
        print("Chassis ID TLV\n\tMAC: %s\nPort ID TLV\n\tIfname: %s\nTime to Live TLV\n\t121"
              % (device.get("peer_mac", "ac:75:1d:00:00:%02x" % dev_id), device["lldp_port"]))
    elif item == "-speed":
        print("Speed: %d Mb/s" % device["speed_mbps"])
    elif item in ("-ping", "-hccs_ping"):
        hccs = item == "-hccs_ping"
        if hccs and not p.get("superpod"):
            print(NOT_SUPPORTED)
            return 1
        if len(rest) < 2 or rest[0] not in ("address", "ipv6_address"):
            print("Usage: hccn_tool -i <id> %s -g address <ip> [pkt <n>]" % item)
            return 1
        count = 3
        if "pkt" in rest:
            count = max(1, min(int(rest[rest.index("pkt") + 1]), 10))
        if "cnt" in rest:
            count = max(1, min(int(rest[rest.index("cnt") + 1]), 10))
        return ping(dev_id, device, rest[1], count, hccs)
    else:
        print("Unsupported item %s in the simulator" % item)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
