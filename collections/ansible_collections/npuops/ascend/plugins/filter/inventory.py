# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""validate_inventory: everything wrong with the inventory, before any node is touched.

Kubespray's validate_inventory, as one pure function: it returns every problem at once, each naming
the host (when it is per host), the variable, the value it has and what to do.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress

from ansible_collections.npuops.ascend.plugins.plugin_utils.hostvars import hostvar

ENGINES = ("docker", "podman", "isula")


def _ipv4(value):
    try:
        return isinstance(value, str) and ipaddress.ip_address(value).version == 4
    except ValueError:
        return False


def validate(groups, hostvars, known_tiers, presets, booleans=(), tier_groups=None):
    """-> list of problem strings (empty when the inventory is fine).

    `known_tiers`: {tier: node count}; `tier_groups`: {tier: {group: node count}} for tiers that need
    more groups than npu_nodes (8p8d_pd: prefill and decode).
    """
    problems = []
    nodes = list(groups.get("npu_nodes", []))
    if not nodes:
        return ["the inventory has no hosts in group npu_nodes; put every NPU server in npu_nodes"]
    first = nodes[0]
    tier = hostvar(hostvars, first, "npuops_tier")
    if tier not in known_tiers:
        problems.append("npuops_tier = %r is not a tier; set it to one of %s" % (tier, ", ".join(sorted(known_tiers))))
    elif len(nodes) != int(known_tiers[tier]):
        problems.append("npuops_tier %s needs %d hosts in npu_nodes, the inventory has %d (%s)"
                        % (tier, known_tiers[tier], len(nodes), ", ".join(nodes)))
    for name in ("npuops_tier", "npuops_model", "npuops_model_dir", "npuops_image", "npuops_container_engine"):
        values = {}
        for h in nodes:
            values.setdefault(repr(hostvar(hostvars, h, name)), []).append(h)
        if len(values) > 1:
            problems.append("%s differs between hosts (%s); it must be the same on every node of the cluster"
                            % (name, "; ".join("%s on %s" % (v, ", ".join(hs)) for v, hs in sorted(values.items()))))
    model = hostvar(hostvars, first, "npuops_model")
    if model not in presets:
        problems.append("npuops_model = %r is not a model preset; use one of %s (or add a preset)"
                        % (model, ", ".join(sorted(presets))))
    model_dir = hostvar(hostvars, first, "npuops_model_dir")
    if not isinstance(model_dir, str) or not model_dir.startswith("/"):
        problems.append("npuops_model_dir = %r must be an absolute path on the nodes, e.g. /data/models/Kimi-K3-W4A8"
                        % (model_dir,))
    image = hostvar(hostvars, first, "npuops_image")
    if not isinstance(image, str) or not image.strip() or " " in image:
        problems.append("npuops_image = %r must be an image reference, e.g. quay.io/ascend/vllm-ascend:v0.23.0-a3"
                        % (image,))
    engine = hostvar(hostvars, first, "npuops_container_engine")
    if engine is not None and engine not in ENGINES:
        problems.append("npuops_container_engine = %r must be one of %s" % (engine, ", ".join(ENGINES)))

    seen_ip, seen_fabric = {}, {}
    for h in nodes:
        ip = hostvar(hostvars, h, "npuops_node_ip")
        if not _ipv4(ip):
            problems.append("host %s: npuops_node_ip = %r is not an IPv4 address; set it to the address of the node "
                            "on npuops_nic (HCCL_IF_IP and VLLM_HOST_IP are set from it)" % (h, ip))
        elif ip in seen_ip:
            problems.append("host %s: npuops_node_ip %s is also the address of %s; every node needs its own"
                            % (h, ip, seen_ip[ip]))
        else:
            seen_ip[ip] = h
        nic = hostvar(hostvars, h, "npuops_nic")
        if not isinstance(nic, str) or not nic.strip() or len(nic) > 15 or " " in nic:
            problems.append("host %s: npuops_nic = %r must name the interface that owns npuops_node_ip "
                            "(e.g. enp189s0f0); GLOO/TP/HCCL_SOCKET_IFNAME are set from it" % (h, nic))
        fabric = hostvar(hostvars, h, "npuops_fabric_ip")
        if fabric is not None:
            if not _ipv4(fabric):
                problems.append("host %s: npuops_fabric_ip = %r is not an IPv4 address; set it to the node's address "
                                "on the fast network, or leave it unset to use npuops_node_ip" % (h, fabric))
            elif fabric in seen_fabric:
                problems.append("host %s: npuops_fabric_ip %s is also the address of %s" % (h, fabric, seen_fabric[fabric]))
            else:
                seen_fabric[fabric] = h
        for name in booleans:
            value = hostvar(hostvars, h, name)
            if value is not None and not isinstance(value, bool):
                kind = "string" if isinstance(value, str) else "number" if isinstance(value, (int, float)) else \
                    type(value).__name__
                problems.append("host %s: %s = %r is a %s, not a boolean; write true/false in YAML, or pass JSON on "
                                "the command line: -e '{\"%s\": false}' (-e %s=false is a string)"
                                % (h, name, str(value) if isinstance(value, str) else value, kind, name, name))
    for group, count in sorted(((tier_groups or {}).get(tier) or {}).items()):
        members = list(groups.get(group, []))
        if len(members) != int(count):
            problems.append("npuops_tier %s needs %d hosts in group %s, the inventory has %d (%s)"
                            % (tier, count, group, len(members), ", ".join(members) or "none"))
        stray = [m for m in members if m not in nodes]
        if stray:
            problems.append("group %s has hosts that are not in npu_nodes: %s" % (group, ", ".join(stray)))
    if tier_groups and tier in tier_groups:
        sides = [set(groups.get(g, [])) for g in tier_groups[tier]]
        for i, a in enumerate(sides):
            for b in sides[i + 1:]:
                if a & b:
                    problems.append("hosts %s are in more than one of the groups %s; a node serves one side"
                                    % (", ".join(sorted(a & b)), ", ".join(sorted(tier_groups[tier]))))
        proxy = hostvar(hostvars, first, "npuops_proxy_host")
        if proxy not in nodes and proxy not in hostvars:
            problems.append("npuops_proxy_host = %r is not a host of the inventory; name the host that runs the PD "
                            "proxy (the front door)" % (proxy,))
    return problems


def validate_inventory(groups, hostvars, known_tiers, presets, booleans=(), tier_groups=None):
    return validate(groups, hostvars, known_tiers, presets, booleans, tier_groups)


class FilterModule(object):
    def filters(self):
        return {"validate_inventory": validate_inventory}
