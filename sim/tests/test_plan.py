import ipaddress

import pytest

from npuops_sim import plan


def test_sixteen_a3_nodes_fit_the_address_plan_without_collisions():
    p = plan.AddressPlan()
    nodes = plan.nodes(16, "a3")
    mgmt = [n.mgmt_ip for n in nodes]
    fabric = [d["ip"] for n in nodes for d in n.devices] + [n.fabric_ip for n in nodes]
    vnic = [d["vnic_ip"] for n in nodes for d in n.devices]
    assert len(set(mgmt)) == 16 and len(set(fabric)) == 16 * 17 and len(set(vnic)) == 256
    assert all(ipaddress.ip_address(a) in p.mgmt_net for a in mgmt)
    assert all(ipaddress.ip_address(a) in p.fabric_net for a in fabric + vnic)
    assert p.fabric_gateway() not in fabric + vnic
    assert p.mgmt_gateway() not in mgmt


def test_each_node_owns_one_fabric_block_that_holds_its_devices():
    p = plan.AddressPlan()
    for n in plan.nodes(16, "a3"):
        block = ipaddress.ip_network(p.node_fabric_block(n.index))
        assert all(ipaddress.ip_address(d["ip"]) in block for d in n.devices)
        assert ipaddress.ip_address(n.fabric_ip) in block


def test_interface_names_fit_the_kernel_limit_and_carry_the_prefix():
    names = plan.Names("npsim")
    for i in range(1, 17):
        for name in (names.mgmt_veth(i), names.fabric_veth(i), names.mgmt_bridge(), names.fabric_bridge()):
            assert len(name) <= 15 and name.startswith("npsim-")


@pytest.mark.parametrize("count,profile,message", [
    (0, "a3", "between 1 and 16"), (17, "a3", "between 1 and 16"), (2, "a5", "PROFILE must be one of"),
])
def test_bad_sizes_are_refused_with_the_reason(count, profile, message):
    with pytest.raises(ValueError, match=message):
        plan.nodes(count, profile)


def test_public_or_overlapping_networks_are_refused():
    with pytest.raises(ValueError, match="private"):
        plan.AddressPlan("8.8.8.0/24", "10.214.0.0/20")
    with pytest.raises(ValueError, match="not overlapping"):
        plan.AddressPlan("10.214.0.0/24", "10.214.0.0/20")


def test_a2_nodes_have_eight_devices():
    assert [len(n.devices) for n in plan.nodes(2, "a2")] == [8, 8]
