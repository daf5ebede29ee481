# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway in front of the instances: HAProxy and keepalived configurations rendered from the plan, and the
order of a rolling update. Pure functions; the gateway role writes what they return.

HAProxy 2.6 (Debian 12's package), configuration manual sections used: ``option httpchk`` / ``http-check send``
(GET /health: liveness that does not queue behind the load), ``agent-check`` / ``agent-port`` / ``agent-addr`` /
``agent-inter`` (progress, from the gateway agent: a wedged engine answers /health but produces no token),
``default-server inter/fastinter/fall/rise``, ``backup`` and ``option allbackups``, ``balance leastconn``,
``weight``, ``map()`` converters, ``stats socket ... level admin`` and ``hard-stop-after``. keepalived's
``vrrp_instance`` / ``vrrp_script`` (keepalived.conf(5)).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.filter import topology
from ansible_collections.npuops.ascend.plugins.module_utils import haproxy_admin

ADMIN_SOCKET = "/run/haproxy/admin.sock"
PID_FILE = "/run/haproxy.pid"
KEEPALIVED_PID_FILE = "/run/keepalived.pid"  # keepalived's default (keepalived(8) --pid)
HAPROXY_BIN = "/usr/sbin/haproxy"
KEEPALIVED_BIN = "/usr/sbin/keepalived"
TENANT_MAP = "/etc/haproxy/npuops-tenants.map"
STATS_PORT = topology.STATS_PORT
SERVICE_BACKEND = "be_service"
# Liveness: GET /health every second, which vLLM's API server answers without queueing behind the load (a busy engine
# stays in); a server is down after 3 failed checks (300 ms apart once one failed), each bounded by 1.5 s: a dead
# engine is out within ~1 s (connection refused), a frozen one within about 1 + 3 x 1.5 + 2 x 0.3 = 6.1 s. Progress:
# the agent check (roles/gateway/files/npuops_gateway_agent.py on the gateway host, asked every second) says down
# once requests are in flight and the engine has not stepped for AGENT["stall_seconds"]: a wedged engine (/health
# 200, no token) is out within 6 + 1 + 1 = 8 s; HAProxy takes one "down" from an agent (its rise and fall are 1).
# Both inside the 10 s failover budget. Back in after 2 good checks.
CHECK = {"inter": "1s", "fastinter": "300ms", "downinter": "1s", "fall": 3, "rise": 2, "timeout": "1500ms"}
AGENT = {"inter": "1s", "port_base": 18710, "stall_seconds": 6, "interval": 1, "probe_timeout": 3, "probe_every": 5,
         "bind": "127.0.0.1"}


def backend_of(instance):
    return "be_%s" % instance


def server_name(instance, index):
    return "%s-%d" % (instance, index + 1)


def servers(gateway):
    """[(backend, server, instance)] of every server the gateway sends to, in the order the configuration has."""
    out = []
    for inst in gateway["instances"]:
        be = backend_of(inst) if gateway["mode"] == "tenant" else SERVICE_BACKEND
        for i in range(len(gateway["backends"][inst])):
            out.append((be, server_name(inst, i), inst))
    return out


def state_servers(gateway):
    """[{backend, server, address, port}] of the configuration: the servers whose admin state a reload keeps
    (module haproxy_server_state)."""
    out = []
    for be, name, inst in servers(gateway):
        s = gateway["backends"][inst][int(name.rsplit("-", 1)[1]) - 1]
        out.append({"backend": be, "server": name, "address": s["address"], "port": int(s["port"])})
    return out


def _check_lines(health_path):
    return ["    option httpchk",
            "    http-check send meth GET uri %s ver HTTP/1.1 hdr Host npuops-gateway" % health_path,
            "    http-check expect status 200",
            "    timeout check %s" % CHECK["timeout"],
            # a server marked down (dead, frozen, or wedged by the agent's word) has its sessions cut: nothing of
            # theirs comes back; a busy one is never marked down
            "    default-server inter %s fastinter %s downinter %s fall %d rise %d agent-inter %s agent-addr %s "
            "on-marked-down shutdown-sessions" % (CHECK["inter"], CHECK["fastinter"], CHECK["downinter"],
                                                  CHECK["fall"], CHECK["rise"], AGENT["inter"], AGENT["bind"])]


def agent_ports(gateway):
    """{server name: the port its agent check listens on, on the gateway host}."""
    return dict((name, AGENT["port_base"] + i) for i, (_be, name, _inst) in enumerate(servers(gateway)))


def agent_config(gateway, model, api_key=""):
    """The agent's configuration (JSON; it holds the engines' API key for its idle probe: a root-only file)."""
    ports = agent_ports(gateway)
    out = []
    for inst in gateway["instances"]:
        own = (gateway.get("models") or {}).get(inst) or model
        for i, s in enumerate(gateway["backends"][inst]):
            name = server_name(inst, i)
            out.append({"name": name, "agent_port": ports[name], "url": "http://%s:%d" % (s["address"], int(s["port"])),
                        "model": own})
    config = dict((k, AGENT[k]) for k in ("stall_seconds", "interval", "probe_timeout", "probe_every", "bind"))
    config.update(servers=out, api_key=api_key or "")
    return config


def _server_lines(gateway, instances, backup=(), weights=None):
    lines = []
    ports = agent_ports(gateway)
    for inst in instances:
        for i, s in enumerate(gateway["backends"][inst]):
            extra = " backup" if inst in backup else ""
            if weights is not None:
                extra += " weight %d" % int(weights[inst])
            name = server_name(inst, i)
            lines.append("    server %s %s:%d check agent-check agent-port %d%s" % (
                name, s["address"], int(s["port"]), ports[name], extra))
    return lines


def haproxy_config(gateway, model, options=None):
    """haproxy.cfg for the plan's gateway: every server checked for liveness (GET the instance's health path) and for
    progress (the agent check, agent_config). `model` is the service's served model name; `options`: weights
    ({instance: 0-256}, canary), api_key (the engines' key: tenant mode sends it to the engines), tenants (truthy in
    tenant mode: the keys themselves live in the map file, never here)."""
    options = options or {}
    mode = gateway["mode"]
    insts = list(gateway["instances"])
    if mode not in ("active_standby", "active_active", "canary", "tenant"):
        raise AnsibleFilterError("haproxy_config: npuops_gateway_mode %r is not a mode" % (mode,))
    lines = [
        "# Written by the npuops.ascend.gateway role from the plan; changes here are overwritten.",
        "global",
        "    master-worker",
        "    pidfile %s" % PID_FILE,
        # the admin socket: a unix socket, root only; the rolling update drains servers through it
        "    stats socket %s mode 600 level admin expose-fd listeners" % ADMIN_SOCKET,
        # a reload or a restart starts each server in the admin state it had (drained, in maintenance): an
        # instance taken out of rotation stays out until npuops puts it back (module haproxy_server_state)
        "    server-state-file %s" % haproxy_admin.STATE_FILE,
        "    stats timeout 30s",
        # a reload lets the old worker finish its connections, for at most this long
        "    hard-stop-after 120s",
        "",
        "defaults",
        "    mode http",
        "    load-server-state-from-file global",
        # no log lines at all: requests carry API keys in their headers
        "    timeout connect 2s",
        "    timeout client 600s",
        "    timeout server 600s",
        "    timeout http-request 10s",
        "    timeout queue 10s",
        # the engines (uvicorn) close a keep-alive connection after 5 s idle: a request sent down an idle server
        # connection at that moment gets nothing back, a 502. So no idle server connections (the clients keep
        # theirs), and a request that got no byte back or could not connect is sent again, to another server
        "    option http-server-close",
        "    retry-on conn-failure empty-response",
        "    retries 2",
        "    option redispatch 1",
        "",
        "frontend stats",
        "    bind 127.0.0.1:%d" % STATS_PORT,
        "    stats enable",
        "    stats uri /stats",
        "    stats refresh 5s",
        "",
        "frontend npuops",
        "    bind 0.0.0.0:%d" % int(gateway["port"]),
        "    option forwardfor",
        # which instance answered (the server's name, <instance>-<n>): for operators and the canary check
        "    http-response set-header X-Npuops-Server %[srv_name]",
    ]
    if mode == "tenant":
        lines += [
            "    http-request set-var(txn.npuops_key) req.hdr(Authorization),word(2,' ')",
            "    acl npuops_known_key var(txn.npuops_key),map(%s) -m found" % TENANT_MAP,
            "    http-request deny deny_status 401 unless npuops_known_key",
        ]
        if options.get("api_key"):
            lines.append("    http-request set-header Authorization \"Bearer %s\"" % options["api_key"])
        lines += ["    use_backend %%[var(txn.npuops_key),map(%s)]" % TENANT_MAP, ""]
        for inst in insts:
            lines += ["backend %s" % backend_of(inst), "    balance leastconn"]
            lines += _check_lines(gateway.get("health_path") or "/health") + _server_lines(gateway, [inst]) + [""]
        return "\n".join(lines) + "\n"
    lines += ["    default_backend %s" % SERVICE_BACKEND, "", "backend %s" % SERVICE_BACKEND]
    if mode == "active_standby":
        # the first instance serves; the others only while it is down (or drained)
        lines += ["    balance leastconn", "    option allbackups"]
        body = _server_lines(gateway, insts, backup=insts[1:])
    elif mode == "active_active":
        lines += ["    balance leastconn"]
        body = _server_lines(gateway, insts)
    else:
        weights = options.get("weights") or {}
        missing = [i for i in insts if i not in weights]
        if missing:
            raise AnsibleFilterError("haproxy_config: canary mode needs npuops_gateway_weights for %s"
                                     % ", ".join(missing))
        lines += ["    balance roundrobin"]
        body = _server_lines(gateway, insts, weights=weights)
    lines += _check_lines(gateway.get("health_path") or "/health") + body
    return "\n".join(lines) + "\n"


def tenant_map(tenants):
    """The map file of tenant mode: one `<API key> <backend>` line per tenant (file mode 0600)."""
    return "".join("%s %s\n" % (key, backend_of(inst)) for key, inst in sorted((tenants or {}).items()))


def keepalived_config(gateway, host, options=None):
    """keepalived.conf of one gateway host: VRRP between the gateway hosts (unicast, to the other's address), the
    floating address on the host's NIC, and a check that HAProxy runs (the address leaves a host whose HAProxy
    died). The first gateway host has the higher priority."""
    options = options or {}
    hosts = gateway["hosts"]
    if host not in hosts:
        raise AnsibleFilterError("keepalived_config: %s is not a host of group gateway (%s)" % (host, ", ".join(hosts)))
    me = gateway["addresses"][host]
    peers = [gateway["addresses"][h] for h in hosts if h != host]
    prefix = int(options.get("prefix", 24))
    nic = options["nic"]
    lines = [
        "# Written by the npuops.ascend.gateway role from the plan; changes here are overwritten.",
        "global_defs {",
        "    router_id %s" % host,
        "    script_user root",
        "    enable_script_security",
        "}",
        "vrrp_script npuops_haproxy {",
        "    script \"%s\"" % options.get("check_script", "/etc/keepalived/npuops_check_haproxy.sh"),
        "    interval 1",
        "    timeout 2",
        "    fall 2",
        "    rise 2",
        "}",
        "vrrp_instance npuops {",
        "    state BACKUP",
        "    interface %s" % nic,
        "    virtual_router_id %d" % int(options.get("vrid", 51)),
        "    priority %d" % (150 - 50 * hosts.index(host)),
        "    advert_int 1",
        "    unicast_src_ip %s" % me,
        "    unicast_peer {",
    ] + ["        %s" % p for p in peers] + [
        "    }",
        "    virtual_ipaddress {",
        "        %s/%d dev %s" % (gateway["vip"], prefix, nic),
        "    }",
        "    track_script {",
        "        npuops_haproxy",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def rollout_order(plan, restart):
    """The instances a rolling update takes out one at a time, in plan order: those with a group in `restart`
    (group keys ``<instance>/<group>``); -> [{instance, groups, hosts}]."""
    out = []
    for name, inst in plan["instances"].items():
        keys = [g["key"] for g in inst["groups"].values() if g["key"] in restart]
        if keys:
            hosts = [h for g in inst["groups"].values() if g["key"] in keys for h in g["hosts"]]
            out.append({"instance": name, "groups": keys, "hosts": hosts})
    return out


def gateway_servers_of(gateway, instances):
    """[{backend, server}] of an instance (or a list of instances) at the gateway: what a rolling update drains and
    puts back, what recover puts back."""
    if not gateway:
        return []
    names = [instances] if isinstance(instances, str) else list(instances)
    return [{"backend": be, "server": srv} for be, srv, inst in servers(gateway) if inst in names]


class FilterModule(object):
    def filters(self):
        return {"gateway_haproxy_config": haproxy_config, "gateway_tenant_map": tenant_map,
                "gateway_keepalived_config": keepalived_config, "gateway_rollout_order": rollout_order,
                "gateway_servers_of": gateway_servers_of, "gateway_agent_config": agent_config,
                "gateway_state_servers": state_servers}
