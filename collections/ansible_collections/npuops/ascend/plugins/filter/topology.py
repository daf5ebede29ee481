# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""plan_topology: inventory + tier document -> what every host is in the deployment.

One planner for all tiers. A tier document (the tier roles' ``npuops_tier_spec``) lists engine
*instances*: a group of nodes that together run one vLLM engine (multi-node TP/PP with ``--nnodes``,
one DP group with headless workers, or one DP group whose ranks each serve HTTP for a PD proxy). This
turns the inventory's groups, in inventory order, into per-host roles, ranks, leader addresses and
ports, and checks the arithmetic first, naming the offending host or value.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.plugin_utils.hostvars import hostvar

HCCL_HOST_PORTS = 16  # HCCL_IF_BASE_PORT .. +15: one host listen port per device on A3
MIN_KV_PORT_A3 = 36000  # AscendDirect picks random ports in [20000, 20000 + npus*1000) (ascend-facts §4.4)


class PlanError(Exception):
    pass


def _node_ip(hostvars, host):
    ip = hostvar(hostvars, host, "npuops_node_ip")
    if not ip:
        raise PlanError("host %s: npuops_node_ip is not set; set it to the node's address on npuops_nic" % host)
    return str(ip)


def check_instance(inst, tier):
    """The arithmetic of one instance; raises PlanError naming what is wrong."""
    name = inst["name"]
    dies = tier.get("dies_per_node", 16)
    tp, pp, dp = int(inst.get("tp", 1)), int(inst.get("pp", 1)), int(inst.get("dp", 1))
    nodes = int(inst["nodes"])
    launch = inst["launch"]
    if launch not in ("multinode", "dp_internal", "dp_external"):
        raise PlanError("instance %s: launch %r is not one of multinode, dp_internal, dp_external" % (name, launch))
    if tp * pp * dp != nodes * dies:
        raise PlanError("instance %s: TP x PP x DP = %d x %d x %d = %d, but %d nodes x %d dies = %d; the parallel "
                        "sizes must use every die exactly once" % (name, tp, pp, dp, tp * pp * dp, nodes, dies,
                                                                   nodes * dies))
    if pp > 1 and dp > 1:
        raise PlanError("instance %s: PP=%d together with DP=%d across nodes is not supported for MoE over RoCE "
                        "(MoeDistributeDispatch); keep DP=1 with PP, or PP=1 with DP" % (name, pp, dp))
    if launch == "multinode" and dp != 1:
        raise PlanError("instance %s: the multinode launch (--nnodes) keeps DP=1; use dp_internal for DP" % name)
    if launch in ("dp_internal", "dp_external"):
        local = int(inst.get("dp_local", 1))
        if local * nodes != dp:
            raise PlanError("instance %s: dp_local %d x %d nodes != DP %d; every node must host the same number "
                            "of DP ranks" % (name, local, nodes, dp))
        if local * tp > dies:
            raise PlanError("instance %s: dp_local %d x TP %d = %d dies > %d per node"
                            % (name, local, tp, local * tp, dies))
    if inst.get("kv_role"):
        if pp != 1 and inst["kv_role"] == "kv_consumer":
            raise PlanError("instance %s: decode (kv_consumer) needs PP=1 with MooncakeConnectorV1, got PP=%d"
                            % (name, pp))


def check_pd(instances, tier):
    prefill = [i for i in instances if i.get("kv_role") == "kv_producer"]
    decode = [i for i in instances if i.get("kv_role") == "kv_consumer"]
    if not prefill and not decode:
        return
    if len(prefill) != 1 or len(decode) != 1:
        raise PlanError("a PD tier needs exactly one kv_producer and one kv_consumer instance, got %d and %d"
                        % (len(prefill), len(decode)))
    p, d = prefill[0], decode[0]
    if int(p["tp"]) < int(d["tp"]) or int(p["tp"]) % int(d["tp"]) != 0:
        raise PlanError("prefill TP %s must be a multiple of decode TP %s (MooncakeConnector)" % (p["tp"], d["tp"]))
    if int(d.get("pp", 1)) != 1:
        raise PlanError("decode PP must be 1, got %s" % d.get("pp"))
    for inst in (p, d):
        port = int(inst.get("kv_port", 0))
        if tier.get("generation") == "A3" and port < MIN_KV_PORT_A3:
            raise PlanError("instance %s: kv_port %d is inside AscendDirect's random port range on A3; use %d or "
                            "higher (intermittent 'Address already in use' otherwise)" % (inst["name"], port,
                                                                                          MIN_KV_PORT_A3))
    extra_p, extra_d = p.get("kv_connector_extra_config"), d.get("kv_connector_extra_config")
    if extra_p is not None and extra_d is not None and extra_p != extra_d:
        raise PlanError("kv_connector_extra_config differs between prefill (%r) and decode (%r); it must be "
                        "identical on both sides" % (extra_p, extra_d))


def kv_port_range(inst, dp_rank, dies):
    """Ports MooncakeConnector uses on a node: side channel kv_port + dp_rank*tp*pp, plus one per device."""
    base = int(inst["kv_port"]) + dp_rank * int(inst["tp"]) * int(inst.get("pp", 1))
    return base, base + dies - 1


def plan(groups, hostvars, tier):
    instances = tier.get("instances") or []
    if not instances:
        raise PlanError("tier %s lists no instances" % tier.get("name"))
    ports = tier.get("ports", {})
    dies = int(tier.get("dies_per_node", 16))
    for inst in instances:
        check_instance(inst, tier)
    check_pd(instances, tier)

    hosts = {}
    out_instances = {}
    for inst in instances:
        members = list(groups.get(inst["group"], []))
        if len(members) != int(inst["nodes"]):
            raise PlanError("instance %s needs %s hosts in group %s, the inventory has %d (%s)"
                            % (inst["name"], inst["nodes"], inst["group"], len(members), ", ".join(members) or "none"))
        leader = members[0]
        leader_ip = _node_ip(hostvars, leader)
        local = int(inst.get("dp_local", 1))
        for rank, host in enumerate(members):
            if host in hosts:
                raise PlanError("host %s is in instance %s and %s; a node serves one instance"
                                % (host, hosts[host]["instance"], inst["name"]))
            node_ip = _node_ip(hostvars, host)
            launch = inst["launch"]
            serves_http = launch == "dp_external" or rank == 0
            entry = {
                "instance": inst["name"],
                "role": "leader" if rank == 0 else "worker",
                "launch": launch,
                "node_rank": rank,
                "nodes": int(inst["nodes"]),
                "tp": int(inst["tp"]), "pp": int(inst.get("pp", 1)), "dp": int(inst.get("dp", 1)),
                "dp_local": local,
                "dp_start_rank": rank * local,
                "expert_parallel": bool(inst.get("expert_parallel", False)),
                "leader": leader,
                "leader_address": leader_ip,
                "node_ip": node_ip,
                "headless": not serves_http,
                "serves_http": serves_http,
                "api_port": int(ports.get("api", 8000)) if serves_http else None,
                "kv_role": inst.get("kv_role"),
            }
            if inst.get("kv_role"):
                entry["kv_port"] = int(inst["kv_port"])
                entry["kv_ports"] = list(kv_port_range(inst, rank * local, dies))
            hosts[host] = entry
        out_instances[inst["name"]] = {"hosts": members, "leader": leader, "leader_address": leader_ip,
                                       "launch": inst["launch"], "kv_role": inst.get("kv_role")}

    # leader ports the workers connect to, and what must be free on each host
    for host, e in hosts.items():
        launch = e["launch"]
        rendezvous = []
        if launch == "multinode":
            rendezvous = [int(ports.get("master", 29500))]
        elif e["dp"] > 1:
            rendezvous = [int(ports.get("dp_rpc", 13389))]
        e["rendezvous_ports"] = rendezvous
        e["listen"] = rendezvous if (e["role"] == "leader" and e["nodes"] > 1) else []
        e["listen_expect"] = (e["nodes"] - 1) * len(rendezvous) if e["listen"] else 0
        e["reach"] = [{"host": e["leader"], "address": e["leader_address"], "port": p} for p in rendezvous] \
            if e["role"] == "worker" else []
        hccl = int(ports.get("hccl_host_base", 60000))
        free = set(range(hccl, hccl + HCCL_HOST_PORTS))
        if e["serves_http"]:
            free.add(e["api_port"])
        if e["role"] == "leader":
            free.update(rendezvous)
        if e.get("kv_ports"):
            free.update(range(e["kv_ports"][0], e["kv_ports"][1] + 1))
        e["ports_free"] = sorted(free)

    proxy = None
    if tier.get("proxy"):
        proxy_host = tier["proxy"].get("host")
        if not proxy_host:
            raise PlanError("the tier needs a proxy: set npuops_proxy_host to one of the inventory hosts")
        if proxy_host not in hostvars:
            raise PlanError("npuops_proxy_host %s is not a host of the inventory" % proxy_host)
        pp_ = int(tier["proxy"].get("port", 8080))
        by_role = {}
        for inst in instances:
            endpoints = [{"host": h, "address": hosts[h]["node_ip"], "port": hosts[h]["api_port"]}
                         for h in out_instances[inst["name"]]["hosts"] if hosts[h]["serves_http"]]
            by_role["prefill" if inst.get("kv_role") == "kv_producer" else "decode"] = endpoints
        proxy = {"host": proxy_host, "address": _node_ip(hostvars, proxy_host), "port": pp_,
                 "prefill": by_role.get("prefill", []), "decode": by_role.get("decode", [])}
        if proxy_host in hosts:
            entry = hosts[proxy_host]
            clash = [p for p in (entry.get("api_port"),) if p == pp_]
            if clash or (entry.get("kv_ports") and entry["kv_ports"][0] <= pp_ <= entry["kv_ports"][1]):
                raise PlanError("proxy port %d on %s collides with the engine's ports there" % (pp_, proxy_host))
            entry["ports_free"] = sorted(set(entry["ports_free"]) | {pp_})
        endpoint = "http://%s:%d" % (proxy["address"], pp_)
    # every engine that answers HTTP (their /metrics together are the service's), and the first of
    # them: where the benchmark load is generated, next to the server
    front = sorted((h for h, e in hosts.items() if e["serves_http"]),
                   key=lambda h: (list(out_instances).index(hosts[h]["instance"]), hosts[h]["node_rank"]))
    api_urls = ["http://%s:%d" % (hosts[h]["node_ip"], hosts[h]["api_port"]) for h in front]
    if not proxy:
        endpoint = api_urls[0]

    seen = {}
    for host, e in hosts.items():
        ip = e["node_ip"]
        if ip in seen:
            raise PlanError("hosts %s and %s have the same npuops_node_ip %s; every node needs its own"
                            % (seen[ip], host, ip))
        seen[ip] = host
    return {"tier": tier.get("name"), "hosts": hosts, "instances": out_instances, "proxy": proxy,
            "endpoint": endpoint, "api_urls": api_urls, "load_host": front[0]}


def plan_topology(groups, hostvars, tier):
    try:
        return plan(groups, hostvars, tier)
    except PlanError as e:
        raise AnsibleFilterError("plan_topology: %s" % e)


class FilterModule(object):
    def filters(self):
        return {"plan_topology": plan_topology}
