# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway in front of the instances: what the HAProxy and keepalived configurations say for the plan (the
gateway role's templates lay them out), and the order of a rolling update. Pure functions.

HAProxy 2.6 (Debian 12's package), configuration manual sections used: ``option httpchk`` / ``http-check send``
(GET /health: liveness that does not queue behind the load), ``agent-check`` / ``agent-port`` / ``agent-addr`` /
``agent-inter`` (progress, from the gateway agent: a wedged engine answers /health but produces no token),
``default-server inter/fastinter/fall/rise``, ``backup`` and ``option allbackups``, ``balance leastconn``,
``weight``, ``map()`` converters, ``stats socket ... level admin`` and ``hard-stop-after``. keepalived's
``vrrp_instance`` / ``vrrp_script`` (keepalived.conf(5)).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


import os

import jinja2
from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.plugin_utils.model import topology
from ansible_collections.npuops.ascend.plugins.module_utils import haproxy_admin
from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog

ADMIN_SOCKET = "/run/haproxy/admin.sock"
PID_FILE = "/run/haproxy.pid"
KEEPALIVED_PID_FILE = "/run/keepalived.pid"  # keepalived's default (keepalived(8) --pid)
HAPROXY_BIN = "/usr/sbin/haproxy"
KEEPALIVED_BIN = "/usr/sbin/keepalived"
TENANT_MAP = "/etc/haproxy/npuops-tenants.map"
STATS_PORT = topology.STATS_PORT
SERVICE_BACKEND = "be_service"
TEMPLATES = os.path.join(catalog.ROLES_DIR, "gateway", "templates")
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


def _backend(name, balance, gateway, instances, backup=(), weights=None):
    ports = agent_ports(gateway)
    out = {"name": name, "balance": balance, "allbackups": bool(backup), "servers": []}
    for inst in instances:
        for i, s in enumerate(gateway["backends"][inst]):
            out["servers"].append({"name": server_name(inst, i), "address": s["address"], "port": int(s["port"]),
                                   "agent_port": ports[server_name(inst, i)], "backup": inst in backup,
                                   "weight": int(weights[inst]) if weights is not None else None})
    return out


def haproxy(gateway, model=None, options=None):
    """What haproxy.cfg says for the plan's gateway (the role's templates/haproxy.cfg.j2 lays it out): every server
    checked for liveness (GET the instance's health path) and for progress (the agent check, agent_config).
    `model` is the service's served model name; `options`: weights ({instance: 0-256}, canary), api_key (the
    engines' key: tenant mode sends it to the engines), tenants (truthy in tenant mode: the keys themselves live in
    the map file, never here)."""
    options = options or {}
    mode = gateway["mode"]
    insts = list(gateway["instances"])
    if mode not in topology.GATEWAY_MODES:
        raise AnsibleFilterError("haproxy_config: npuops_gateway_mode %r is not a mode" % (mode,))
    if mode == "tenant":
        backends = [_backend(backend_of(inst), "leastconn", gateway, [inst]) for inst in insts]
    elif mode == "active_standby":
        backends = [_backend(SERVICE_BACKEND, "leastconn", gateway, insts, backup=insts[1:])]
    elif mode == "active_active":
        backends = [_backend(SERVICE_BACKEND, "leastconn", gateway, insts)]
    else:
        weights = options.get("weights") or {}
        missing = [i for i in insts if i not in weights]
        if missing:
            raise AnsibleFilterError("haproxy_config: canary mode needs npuops_gateway_weights for %s"
                                     % ", ".join(missing))
        backends = [_backend(SERVICE_BACKEND, "roundrobin", gateway, insts, weights=weights)]
    return {"mode": mode, "pid_file": PID_FILE, "admin_socket": ADMIN_SOCKET, "state_file": haproxy_admin.STATE_FILE,
            "stats_port": STATS_PORT, "port": int(gateway["port"]), "tenant_map": TENANT_MAP,
            "api_key": (options.get("api_key") or "") if mode == "tenant" else "",
            "health_path": gateway.get("health_path") or "/health", "check": dict(CHECK),
            "agent": {"inter": AGENT["inter"], "bind": AGENT["bind"]}, "backends": backends}


def render(template, **values):
    """The role's template `template` (roles/gateway/templates) rendered with `values` as the template module renders
    it (trim_blocks, the trailing newline kept): what the role writes, for previews and tests."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    return env.get_template(template).render(**values)


def haproxy_config(gateway, model=None, options=None):
    """haproxy.cfg for the plan's gateway, as the role writes it."""
    return render("haproxy.cfg.j2", npuops_haproxy=haproxy(gateway, model, options))


def tenant_map(tenants):
    """The map file of tenant mode: one `<API key> <backend>` line per tenant (file mode 0600)."""
    return "".join("%s %s\n" % (key, backend_of(inst)) for key, inst in sorted((tenants or {}).items()))


def keepalived(gateway, host, options=None):
    """What keepalived.conf says on one gateway host (the role's templates/keepalived.conf.j2 lays it out): VRRP
    between the gateway hosts (unicast, to the other's address), the floating address on the host's NIC (`options`:
    nic, vrid, prefix, check_script), and a check that HAProxy runs. The first gateway host has the higher
    priority."""
    options = options or {}
    hosts = gateway["hosts"]
    if host not in hosts:
        raise AnsibleFilterError("keepalived_config: %s is not a host of group gateway (%s)" % (host, ", ".join(hosts)))
    return {"host": host, "nic": options["nic"], "vrid": int(options.get("vrid", 51)),
            "priority": 150 - 50 * hosts.index(host), "address": gateway["addresses"][host],
            "peers": [gateway["addresses"][h] for h in hosts if h != host], "vip": gateway["vip"],
            "prefix": int(options.get("prefix", 24)),
            "check_script": options.get("check_script", "/etc/keepalived/npuops_check_haproxy.sh")}


def keepalived_config(gateway, host, options=None):
    """keepalived.conf of one gateway host, as the role writes it."""
    return render("keepalived.conf.j2", npuops_keepalived=keepalived(gateway, host, options))


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
        return {"gateway_haproxy": haproxy, "gateway_tenant_map": tenant_map,
                "gateway_keepalived": keepalived, "gateway_rollout_order": rollout_order,
                "gateway_servers_of": gateway_servers_of, "gateway_agent_config": agent_config,
                "gateway_state_servers": state_servers}
