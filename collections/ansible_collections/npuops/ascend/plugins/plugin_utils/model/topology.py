# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""plan_topology: inventory + tier document -> what every host is in the deployment.

One planner for all tiers. Words used throughout:

- an *instance* is one serving unit: the hosts of the inventory whose ``npuops_instance`` names it (all of
  ``npu_nodes``, instance ``main``, when no host sets it). An inventory may hold several instances of one tier
  (replicas behind a gateway); each is planned on its own from the same tier document.
- an *engine group* is the nodes of an instance that together run one vLLM engine: multi-node TP/PP with
  ``--nnodes``, one DP group with headless workers, or one DP group whose ranks each serve HTTP for a PD proxy.
  The tier document lists them (``groups``); a group's hosts are the instance's hosts that are in the group's
  ``inventory_group``, in inventory order, the first being the leader. Its key is ``<instance>/<group>``; the
  engines of one group restart together.

The planner expects an inventory the validator (``validate`` in model/inventory.py) found no problem with: every
inventory check is made there, once, collecting every problem. The checks of the tier document's arithmetic live
here (``tier_problems``) and are also run by the validator.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.plugin_utils.model.hostvars import hostvar, setting, table_default

DEFAULT_INSTANCE = table_default("npuops_instance")  # the instance of an inventory that names none
HCCL_HOST_PORTS = 16  # HCCL_IF_BASE_PORT .. +15: one host listen port per device on A3 (CANN HCCL docs)
# AscendDirectTransport picks random ports in [20000, 20000 + NPUs x 1000): kv ports below this collide on
# 16-NPU nodes (vllm-ascend pd_disaggregation_mooncake_multi_node.md, "kv_port")
MIN_KV_PORT_A3 = 36000
LAUNCHES = ("multinode", "dp_internal", "dp_external")
GATEWAY_GROUP = "gateway"
GATEWAY_MODES = ("active_standby", "active_active", "canary", "tenant")
STATS_PORT = 8404  # HAProxy's stats page, on 127.0.0.1 of each gateway host (filter gateway renders it)


class PlanError(Exception):
    pass


# ------------------------------------------------------------------------------------------ the tier document

def group_problems(group, tier):
    """The arithmetic of one engine group of a tier document: a list of problems (empty when it is sound)."""
    name = group.get("name")
    dies = int(tier.get("dies_per_node", 16))
    tp, pp, dp = int(group.get("tp", 1)), int(group.get("pp", 1)), int(group.get("dp", 1))
    nodes = int(group.get("nodes", 0))
    launch = group.get("launch")
    if launch not in LAUNCHES:
        return ["group %s: launch %r is not one of %s" % (name, launch, ", ".join(LAUNCHES))]
    out = []
    if tp * pp * dp != nodes * dies:
        out.append("group %s: TP x PP x DP = %d x %d x %d = %d, but %d nodes x %d dies = %d; the parallel sizes must "
                   "use every die exactly once" % (name, tp, pp, dp, tp * pp * dp, nodes, dies, nodes * dies))
    if pp > 1 and dp > 1:
        # vllm-ascend pipeline_parallel.md, Limitations: MoeDistributeDispatch does not support the combination
        out.append("group %s: PP=%d together with DP=%d across nodes is not supported for MoE over RoCE "
                   "(MoeDistributeDispatch); keep DP=1 with PP, or PP=1 with DP" % (name, pp, dp))
    if launch == "multinode" and dp != 1:
        out.append("group %s: the multinode launch (--nnodes) keeps DP=1; use dp_internal for DP" % name)
    if launch in ("dp_internal", "dp_external"):
        local = int(group.get("dp_local", 1))
        if local * nodes != dp:
            out.append("group %s: dp_local %d x %d nodes != DP %d; every node must host the same number of DP ranks"
                       % (name, local, nodes, dp))
        if local * tp > dies:
            out.append("group %s: dp_local %d x TP %d = %d dies > %d per node" % (name, local, tp, local * tp, dies))
    if group.get("kv_role") == "kv_consumer" and pp != 1:
        out.append("group %s: decode (kv_consumer) needs PP=1 with MooncakeConnectorV1, got PP=%d" % (name, pp))
    return out


def pd_problems(tier):
    groups = tier.get("groups") or []
    prefill = [g for g in groups if g.get("kv_role") == "kv_producer"]
    decode = [g for g in groups if g.get("kv_role") == "kv_consumer"]
    if not prefill and not decode:
        return []
    if len(prefill) != 1 or len(decode) != 1:
        return ["a PD tier needs exactly one kv_producer and one kv_consumer group, got %d and %d"
                % (len(prefill), len(decode))]
    p, d = prefill[0], decode[0]
    out = []
    if int(p["tp"]) < int(d["tp"]) or int(p["tp"]) % int(d["tp"]) != 0:
        out.append("prefill TP %s must be a multiple of decode TP %s (MooncakeConnector)" % (p["tp"], d["tp"]))
    extra_p, extra_d = p.get("kv_connector_extra_config"), d.get("kv_connector_extra_config")
    if extra_p is not None and extra_d is not None and extra_p != extra_d:
        out.append("kv_connector_extra_config differs between prefill (%r) and decode (%r); it must be identical on "
                   "both sides" % (extra_p, extra_d))
    if not tier.get("proxy"):
        out.append("a PD tier needs a proxy (the front door that sends each request to prefill, then decode)")
    return out


def tier_problems(tier):
    """Everything wrong with a tier document itself, prefixed with its name."""
    groups = tier.get("groups") or []
    if not groups:
        return ["tier %s lists no engine groups" % tier.get("name")]
    out = []
    for g in groups:
        out.extend(group_problems(g, tier))
    out.extend(pd_problems(tier))
    if sum(int(g.get("nodes", 0)) for g in groups) != int(tier.get("nodes", 0)):
        out.append("the groups' nodes add up to %d, the tier has %s" % (sum(int(g.get("nodes", 0)) for g in groups),
                                                                        tier.get("nodes")))
    return ["tier %s: %s" % (tier.get("name"), p) for p in out]


# ------------------------------------------------------------------------------------------ the inventory side

def instances_of(groups, hostvars):
    """{instance name: [hosts]} in inventory order: hosts of npu_nodes grouped by npuops_instance."""
    out = {}
    for h in groups.get("npu_nodes", []):
        out.setdefault(str(setting(hostvars, h, "npuops_instance")), []).append(h)
    return out


def group_hosts(group, groups, instance_hosts):
    """The hosts of one engine group inside an instance, in inventory order."""
    wanted = set(groups.get(group.get("inventory_group", "npu_nodes"), []))
    return [h for h in instance_hosts if h in wanted]


def port_variable(name):
    return "npuops_%s_port" % name


def kv_port_variable(group):
    return "npuops_%s_kv_port" % group["name"]


def instance_ports(tier, hostvars, first):
    """The tier's ports with the inventory's overrides (read from the instance's first host)."""
    return dict((name, int(hostvar(hostvars, first, port_variable(name), default)))
                for name, default in (tier.get("ports") or {}).items())


def node_count_variable(group):
    return "npuops_%s_nodes" % group["name"]


def sized(tier, hostvars, first):
    """The tier as one instance runs it. A prefill/decode group's node count is the inventory's
    ``npuops_<group>_nodes`` when set (xPyD: prefill and decode scale independently; the document's 8P8D by default),
    its DP follows (nodes x dp_local), and so do the ranks, the ports and the proxy's lists. Read from the instance's
    first host; the validator has checked the values."""
    groups, changed = [], False
    for g in tier.get("groups") or []:
        if g.get("kv_role"):
            n = int(hostvar(hostvars, first, node_count_variable(g), g["nodes"]))
            if n != int(g["nodes"]):
                g = dict(g, nodes=n, dp=n * int(g.get("dp_local", 1)))
                changed = True
        groups.append(g)
    if not changed:
        return tier
    return dict(tier, groups=groups, nodes=sum(int(g["nodes"]) for g in groups))


def shape(tier):
    """``8P8D`` for a prefill/decode tier (nodes of each side), None otherwise."""
    sides = dict((g.get("kv_role"), int(g["nodes"])) for g in tier.get("groups") or [] if g.get("kv_role"))
    if "kv_producer" not in sides or "kv_consumer" not in sides:
        return None
    return "%dP%dD" % (sides["kv_producer"], sides["kv_consumer"])


def group_kv_port(group, hostvars, first):
    return int(hostvar(hostvars, first, kv_port_variable(group), group["kv_port"]))


def proxy_port(tier, hostvars, first):
    return int(hostvar(hostvars, first, "npuops_proxy_port", tier["proxy"].get("port", 8080)))


def kv_port_range(group, kv_port, dp_rank, dies):
    """Ports MooncakeConnector uses on a node: the side channel kv_port + dp_rank*tp*pp, plus one per device
    (vllm_ascend/distributed/mooncake_connector.py)."""
    base = int(kv_port) + dp_rank * int(group["tp"]) * int(group.get("pp", 1))
    return base, base + dies - 1


def group_key(instance, group):
    return "%s/%s" % (instance, group)


def fabric_ip(hostvars, host):
    """The address a host's peers reach it at on the fabric (the weight copy): npuops_fabric_ip, else its
    npuops_node_ip (the row's default), else None."""
    return hostvar(hostvars, host, "npuops_fabric_ip") or hostvar(hostvars, host, "npuops_node_ip")


def _node_ip(hostvars, host):
    ip = hostvar(hostvars, host, "npuops_node_ip")
    if not ip:
        raise PlanError("host %s: npuops_node_ip is not set; set it to the node's address on npuops_nic" % host)
    return str(ip)


def _plan_group(group, members, instance, tier, ports, hostvars, hosts, dies):
    leader = members[0]
    leader_ip = _node_ip(hostvars, leader)
    local = int(group.get("dp_local", 1))
    kv_port = group_kv_port(group, hostvars, members[0]) if group.get("kv_role") else None
    launch = group["launch"]
    if launch == "multinode":
        rendezvous = [ports.get("master", 29500)]
    elif int(group.get("dp", 1)) > 1:
        rendezvous = [ports.get("dp_rpc", 13389)]
    else:
        rendezvous = []
    hccl = ports.get("hccl_host_base", 60000)
    for rank, host in enumerate(members):
        if host in hosts:
            raise PlanError("host %s is in groups %s and %s; a node serves one engine group"
                            % (host, hosts[host]["group_key"], group_key(instance, group["name"])))
        serves_http = launch == "dp_external" or rank == 0
        role = "leader" if rank == 0 else "worker"
        entry = {
            "instance": instance,
            "group": group["name"],
            "group_key": group_key(instance, group["name"]),
            "role": role,
            "launch": launch,
            "node_rank": rank,
            "nodes": len(members),
            "tp": int(group["tp"]), "pp": int(group.get("pp", 1)), "dp": int(group.get("dp", 1)),
            "dp_local": local,
            "dp_start_rank": rank * local,
            "expert_parallel": bool(group.get("expert_parallel", False)),
            "leader": leader,
            "leader_address": leader_ip,
            "node_ip": _node_ip(hostvars, host),
            "headless": not serves_http,
            "serves_http": serves_http,
            "api_port": ports.get("api", 8000) if serves_http else None,
            "kv_role": group.get("kv_role"),
            "rendezvous_ports": list(rendezvous),
            # the preflight reach check: the leader listens on its rendezvous ports, the workers dial them
            "listen": list(rendezvous) if role == "leader" and len(members) > 1 else [],
            "listen_expect": (len(members) - 1) * len(rendezvous) if role == "leader" and len(members) > 1 else 0,
            "reach": [{"host": leader, "address": leader_ip, "port": p} for p in rendezvous] if role == "worker"
            else [],
        }
        free = set(range(hccl, hccl + HCCL_HOST_PORTS))
        if serves_http:
            free.add(entry["api_port"])
        if role == "leader":
            free.update(rendezvous)
        if kv_port is not None:
            entry["kv_port"] = kv_port
            entry["kv_ports"] = list(kv_port_range(group, kv_port, rank * local, dies))
            free.update(range(entry["kv_ports"][0], entry["kv_ports"][1] + 1))
        entry["engine_ports"] = sorted(free)
        entry["ports_free"] = sorted(free)
        hosts[host] = entry
    return {"key": group_key(instance, group["name"]), "hosts": list(members), "leader": leader,
            "leader_address": leader_ip, "launch": launch, "kv_role": group.get("kv_role"),
            "tp": int(group["tp"]), "dp": int(group.get("dp", 1))}


def _plan_proxy(tier, instance, plan_groups, hostvars, hosts, first):
    proxy_host = hostvar(hostvars, first, "npuops_proxy_host")
    if not proxy_host or proxy_host not in hostvars:
        raise PlanError("instance %s: npuops_proxy_host %r is not a host of the inventory" % (instance, proxy_host))
    port = proxy_port(tier, hostvars, first)
    sides = {}
    for g in tier["groups"]:
        pg = plan_groups[g["name"]]
        sides["prefill" if g.get("kv_role") == "kv_producer" else "decode"] = [
            {"host": h, "address": hosts[h]["node_ip"], "port": hosts[h]["api_port"]}
            for h in pg["hosts"] if hosts[h]["serves_http"]]
    proxy = {"host": proxy_host, "address": _node_ip(hostvars, proxy_host), "port": port,
             "health": tier["proxy"].get("health", "/healthcheck"),
             "prefill": sides.get("prefill", []), "decode": sides.get("decode", [])}
    if proxy_host in hosts:
        hosts[proxy_host]["ports_free"] = sorted(set(hosts[proxy_host]["ports_free"]) | {port})
    return proxy


KV_POOLS = ("none", "memcache")


def _plan_kv_pool(tier, instance, proxy, hostvars, hosts, members):
    """The memcache KV pool of a prefill/decode instance (``npuops_kv_pool: memcache``), or None: the MetaService's
    host (``npuops_kv_pool_host``, default the proxy's), its URLs and the configuration files. Every engine of the
    instance is told (``kv_pool``) so the deviation rows that stand in for a missing pool apply only without one."""
    first = members[0]
    pool = str(setting(hostvars, first, "npuops_kv_pool"))
    for h in members:
        hosts[h]["kv_pool"] = pool != "none"
    if pool == "none":
        return None
    spec = tier.get("kv_pool")
    if not spec or not proxy:
        raise PlanError("instance %s: npuops_kv_pool %s needs a prefill/decode tier with a kv_pool section (tier %s has "
                        "none)" % (instance, pool, tier.get("name")))
    host = hostvar(hostvars, first, "npuops_kv_pool_host") or proxy["host"]
    address = _node_ip(hostvars, host)
    out = dict(spec, backend=pool, host=host, address=address,
               meta_service_url="tcp://%s:%d" % (address, int(spec["meta_port"])),
               config_store_url="tcp://%s:%d" % (address, int(spec["config_store_port"])),
               metrics_url="%s:%d" % (address, int(spec["metrics_port"])))
    if host in hosts:
        pool_ports = {int(spec["meta_port"]), int(spec["config_store_port"]), int(spec["metrics_port"])}
        hosts[host]["ports_free"] = sorted(set(hosts[host]["ports_free"]) | pool_ports)
    return out


def plan(groups, hostvars, tier, models=None):
    """`models`: {instance: what it serves} (instance_specs): its tier document (with its recipe's ports), its
    served model name, model preset, directories and recipe, which the plan names per instance; the first instance's
    served name is the service's (what clients of a gateway, validate and the benchmark ask for)."""
    dies = int(tier.get("dies_per_node", 16))
    models = models or {}
    hosts = {}
    instances = {}
    for name, members in instances_of(groups, hostvars).items():
        serves = models.get(name) or {}
        itier = sized(serves.get("tier") or tier, hostvars, members[0])
        ports = instance_ports(itier, hostvars, members[0])
        plan_groups = {}
        for g in itier["groups"]:
            ghosts = group_hosts(g, groups, members)
            if len(ghosts) != int(g["nodes"]):
                raise PlanError("instance %s: group %s needs %s hosts of %s, it has %d (%s)" % (
                    name, g["name"], g["nodes"], g.get("inventory_group"), len(ghosts), ", ".join(ghosts) or "none"))
            plan_groups[g["name"]] = _plan_group(g, ghosts, name, itier, ports, hostvars, hosts, dies)
        proxy = _plan_proxy(itier, name, plan_groups, hostvars, hosts, members[0]) if itier.get("proxy") else None
        kv_pool = _plan_kv_pool(itier, name, proxy, hostvars, hosts, members)
        serving = [h for g in itier["groups"] for h in plan_groups[g["name"]]["hosts"] if hosts[h]["serves_http"]]
        api_urls = ["http://%s:%d" % (hosts[h]["node_ip"], hosts[h]["api_port"]) for h in serving]
        endpoint = "http://%s:%d" % (proxy["address"], proxy["port"]) if proxy else api_urls[0]
        front = proxy["host"] if proxy else serving[0]
        instances[name] = {
            "hosts": list(members),
            "ports": ports,
            "groups": plan_groups,
            "leader": plan_groups[itier["groups"][0]["name"]]["leader"],
            "shape": shape(itier),
            "kv_pool": kv_pool,
            "proxy": proxy,
            "endpoint": endpoint,
            "front_host": front,  # the host whose listener is the front door
            "health_path": proxy["health"] if proxy else "/health",
            "api_urls": api_urls,
            # where the benchmark load and the smoke checks start: the first serving engine, next to the server
            "load_host": serving[0],
            "served_model_name": serves.get("served_model_name"),
            "model": dict((k, serves.get(k)) for k in ("model", "model_dir", "tokenizer_dir")),
            # the draft it runs for speculative decoding (npuops_draft): the weights stage copies it like the model
            "draft": dict((k, serves["draft"].get(k)) for k in ("name", "repo", "dir", "method", "num_speculative_tokens"))
            if serves.get("draft") else None,
            "recipe": (serves.get("recipe") or {}).get("name"),
        }
    first = instances[next(iter(instances))]
    gateway = plan_gateway(groups, hostvars, instances)
    monitor = plan_monitor(groups, hostvars)
    out = {"tier": tier.get("name"), "hosts": hosts, "instances": instances, "gateway": gateway, "monitor": monitor,
           "endpoint": gateway["endpoint"] if gateway else first["endpoint"],
           "health_path": "/health" if gateway else first["health_path"],
           "api_urls": [u for i in instances.values() for u in i["api_urls"]], "load_host": first["load_host"],
           "served_model_name": first["served_model_name"]}
    out["members"] = plan_members(out)
    return out


def plan_monitor(groups, hostvars):
    """Where Prometheus runs: the hosts of group ``monitor`` (``npuops_monitor_group``), or the first NPU node."""
    nodes = list(groups.get("npu_nodes") or [])
    name = setting(hostvars, nodes[0] if nodes else None, "npuops_monitor_group")
    return {"group": name, "hosts": list(groups.get(name) or []) or nodes[:1]}


def plan_members(plan):
    """{host: [jobs]} of every host the plan gives something to do: engine (and proxy) hosts, gateway hosts, the
    Prometheus hosts and the load host. Plays run over these hosts and each role acts on its own; a host of the
    inventory without a job leaves the play once the plan is made."""
    out = {}
    for host in plan["hosts"]:
        out.setdefault(host, []).append("engine")
    for inst in plan["instances"].values():
        if inst.get("proxy"):
            out.setdefault(inst["proxy"]["host"], []).append("proxy")
        if inst.get("kv_pool"):
            out.setdefault(inst["kv_pool"]["host"], []).append("kv_pool")
    for host in (plan.get("gateway") or {}).get("hosts", []):
        out.setdefault(host, []).append("gateway")
    for host in (plan.get("monitor") or {}).get("hosts", []):
        out.setdefault(host, []).append("prometheus")
    out.setdefault(plan["load_host"], []).append("load")
    return out


def plan_gateway(groups, hostvars, instances):
    """The gateway in front of the instances (group ``gateway``), or None: its hosts, the floating address
    (``npuops_gateway_vip``) that is the service's endpoint, the port, the mode, and per instance the servers
    (every engine that serves HTTP, or the instance's PD proxy)."""
    gw_hosts = list(groups.get(GATEWAY_GROUP, []))
    if not gw_hosts:
        return None
    first = gw_hosts[0]
    vip = str(hostvar(hostvars, first, "npuops_gateway_vip"))
    port = int(setting(hostvars, first, "npuops_gateway_port"))
    backends = {}
    for name, inst in instances.items():
        if inst.get("proxy"):
            servers = [{"address": inst["proxy"]["address"], "port": inst["proxy"]["port"]}]
        else:
            servers = []
            for url in inst["api_urls"]:
                address, p = url[len("http://"):].rsplit(":", 1)
                servers.append({"address": address, "port": int(p)})
        backends[name] = servers
    return {"hosts": gw_hosts, "vip": vip, "port": port, "stats_port": STATS_PORT,
            "addresses": dict((h, _node_ip(hostvars, h)) for h in gw_hosts),
            "mode": str(setting(hostvars, first, "npuops_gateway_mode")),
            "endpoint": "http://%s:%d" % (vip, port), "instances": list(instances), "backends": backends,
            # the model each instance serves: in tenant mode each backend's health check asks for its own
            "models": dict((name, inst.get("served_model_name")) for name, inst in instances.items()),
            # what the gateway's liveness check asks (an engine's /health, or a PD proxy's health path)
            "health_path": next(iter(instances.values())).get("health_path") or "/health"}


def instance_model(inst):
    """What an instance of the plan serves, as status, the benchmark and the outcome name it: its served model name,
    model preset, model directory, recipe and draft (replicas may serve different weights, with or without a draft)."""
    model = inst.get("model") or {}
    draft = inst.get("draft") or {}
    return {"served_model_name": inst.get("served_model_name"), "preset": model.get("model"),
            "model_dir": model.get("model_dir"), "recipe": inst.get("recipe"), "draft": draft.get("name"),
            "num_speculative_tokens": draft.get("num_speculative_tokens")}


def instance_models(instances):
    """{instance: instance_model} of the plan's instances."""
    return dict((name, instance_model(inst)) for name, inst in (instances or {}).items())


def plan_topology(groups, hostvars, tier, models=None):
    try:
        return plan(groups, hostvars, tier, models)
    except PlanError as e:
        raise AnsibleFilterError("plan_topology: %s" % e)
    except (KeyError, TypeError, ValueError) as e:
        raise AnsibleFilterError("plan_topology: the inventory has problems the validator reports (run the plan "
                                 "role - filter inventory_model - first): %s: %s" % (type(e).__name__, e))
