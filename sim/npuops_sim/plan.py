"""Names and addresses of a simulated cluster: pure functions, so tests and tear-down agree on them.

Everything the simulator creates carries the cluster's prefix (default `npsim`), which is how `down`
finds what it made even after a crash, without ever matching anything else on the machine.
"""
import ipaddress
from dataclasses import dataclass, field

MAX_NODES = 16
DEVICES = {"a3": 16, "a2": 8}
CHIPS_PER_CARD = {"a3": 2, "a2": 1}
MGMT_NIC = "enp189s0f0"   # the node NIC that owns the node IP (what npuops_nic names)
FABRIC_NIC = "enp61s0f0"  # the fast network the weight copies and the NPU device addresses ride on


@dataclass(frozen=True)
class AddressPlan:
    """One private /24 for management and one private /20 for the NPU fabric (16 nodes x 16 devices)."""

    mgmt: str = "10.213.0.0/24"
    fabric: str = "10.214.0.0/20"

    def __post_init__(self):
        mgmt = ipaddress.ip_network(self.mgmt)
        fabric = ipaddress.ip_network(self.fabric)
        if not (mgmt.is_private and fabric.is_private):
            raise ValueError("simulator networks must be private: %s, %s" % (mgmt, fabric))
        if mgmt.prefixlen > 24 or fabric.prefixlen > 20 or mgmt.overlaps(fabric):
            raise ValueError("need a /24 (or larger) for management and a /20 for the fabric, not overlapping")

    @property
    def mgmt_net(self):
        return ipaddress.ip_network(self.mgmt)

    @property
    def fabric_net(self):
        return ipaddress.ip_network(self.fabric)

    def mgmt_gateway(self):
        return str(self.mgmt_net.network_address + 1)

    def node_ip(self, index):
        return str(self.mgmt_net.network_address + 10 + index)

    def _fabric_block(self, index):
        # node `index` (1-based) owns the /24 number index-1 inside the fabric /20
        return self.fabric_net.network_address + 256 * (index - 1)

    def node_fabric_block(self, index):
        return "%s/24" % self._fabric_block(index)

    def device_ip(self, index, phy_id):
        return str(self._fabric_block(index) + 1 + phy_id)

    def node_fabric_ip(self, index):
        return str(self._fabric_block(index) + 100)

    def vnic_ip(self, index, phy_id):
        # the A3 vNIC (HCCS plane) address: a separate, unrouted range inside the same /20 block
        return str(self._fabric_block(index) + 128 + phy_id)

    def fabric_gateway(self):
        # the bridge's own address on the fabric; hccn.conf's netdetect/gateway point at it
        return str(self.fabric_net.broadcast_address - 1)

    def fabric_netmask(self):
        return str(self.fabric_net.netmask)

    def gateway_vip(self):
        # the gateway pair's floating address: outside the node range (.11 - .26), inside the management /24
        return str(self.mgmt_net.network_address + 250)


@dataclass(frozen=True)
class Names:
    prefix: str = "npsim"

    def __post_init__(self):
        if not (self.prefix.isalnum() and self.prefix.islower() and 2 <= len(self.prefix) <= 6):
            raise ValueError("sim id must be 2-6 lowercase letters/digits: %r" % self.prefix)

    def netns(self, index):
        return "%s-n%02d" % (self.prefix, index)

    def host(self, index):
        return "node%02d" % index

    def gateway_host(self, number):
        return "gw%02d" % number

    def mgmt_bridge(self):
        return "%s-mgmt" % self.prefix

    def fabric_bridge(self):
        return "%s-fab" % self.prefix

    def mgmt_veth(self, index):
        return "%s-m%02d" % (self.prefix, index)

    def fabric_veth(self, index):
        return "%s-f%02d" % (self.prefix, index)


@dataclass
class NodeSpec:
    index: int
    name: str
    netns: str
    mgmt_ip: str
    fabric_ip: str
    devices: list = field(default_factory=list)  # [{phy_id, ip, vnic_ip}]
    gateway: bool = False  # a host without NPUs, not in npu_nodes: a gateway host (HAProxy + keepalived) or a monitor
    group: str = "npu_nodes"  # the inventory group: npu_nodes, gateway or monitor


def nodes(count, profile, names=Names(), plan=AddressPlan(), gateways=0, monitors=0):
    """The NPU nodes node01..nodeNN, then `gateways` hosts without NPUs (gw01..), then `monitors` (mon01, Prometheus
    away from the NPU nodes), numbered after them."""
    if not 1 <= count <= MAX_NODES:
        raise ValueError("NODES must be between 1 and %d, got %d" % (MAX_NODES, count))
    if not 0 <= gateways <= 2 or not 0 <= monitors <= 1 or count + gateways + monitors > MAX_NODES:
        raise ValueError("GATEWAYS must be 0, 1 or 2, MONITORS 0 or 1, and NODES + GATEWAYS + MONITORS at most %d"
                         % MAX_NODES)
    if profile not in DEVICES:
        raise ValueError("PROFILE must be one of %s, got %r" % (sorted(DEVICES), profile))
    out = []
    for i in range(1, count + 1):
        devs = [{"phy_id": d, "ip": plan.device_ip(i, d), "vnic_ip": plan.vnic_ip(i, d)}
                for d in range(DEVICES[profile])]
        out.append(NodeSpec(i, names.host(i), names.netns(i), plan.node_ip(i), plan.node_fabric_ip(i), devs))
    for k in range(1, gateways + 1):
        i = count + k
        out.append(NodeSpec(i, names.gateway_host(k), names.netns(i), plan.node_ip(i), plan.node_fabric_ip(i), [],
                            gateway=True, group="gateway"))
    for k in range(1, monitors + 1):
        i = count + gateways + k
        out.append(NodeSpec(i, "mon%02d" % k, names.netns(i), plan.node_ip(i), plan.node_fabric_ip(i), [],
                            gateway=True, group="monitor"))
    return out
