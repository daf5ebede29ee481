# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.filter import gateway as gw
from ansible_collections.npuops.ascend.plugins.plugin_utils.model import serve, topology
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import tier_spec
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.test_inventory import check, two_instances


def with_gateway(mode="active_standby", **extra):
    groups, hv = two_instances()
    groups["gateway"] = ["gw01", "gw02"]
    groups["all"] += ["gw01", "gw02"]
    for i, g in enumerate(groups["gateway"]):
        hv[g] = {"npuops_node_ip": "10.0.0.%d" % (40 + i), "npuops_nic": "enp189s0f0"}
    for h in hv:
        hv[h].update(npuops_gateway_vip="10.0.0.250", npuops_gateway_mode=mode, **extra)
    return groups, hv


def plan_of(groups, hv):
    return topology.plan(groups, hv, tier_spec("4node_dp"))


def test_two_instances_and_a_gateway_pair_are_a_valid_inventory(presets):
    groups, hv = with_gateway()
    assert check(groups, hv, presets) == []


def test_the_plan_of_replicas_has_the_floating_address_as_its_endpoint():
    p = plan_of(*with_gateway())
    assert p["endpoint"] == "http://10.0.0.250:8000"
    assert p["instances"]["a"]["leader"] == "node01" and p["instances"]["b"]["leader"] == "node05"
    assert p["gateway"]["backends"] == {"a": [{"address": "10.0.0.11", "port": 8000}],
                                        "b": [{"address": "10.0.0.15", "port": 8000}]}
    assert p["gateway"]["addresses"] == {"gw01": "10.0.0.40", "gw02": "10.0.0.41"}


def test_gateway_problems_are_named_each_with_its_fix(presets):
    groups, hv = with_gateway(mode="round_robin")
    hv["gw02"]["npuops_node_ip"] = "10.0.0.11"
    for h in hv:
        hv[h]["npuops_gateway_vip"] = "10.0.0.40"
    groups["gateway"].append("node03")
    problems = check(groups, hv, presets)
    assert "hosts node03 are in both gateway and npu_nodes; the gateway runs on hosts of its own" in problems
    assert "group gateway has 3 hosts (gw01, gw02, node03); it takes one or two (a pair sharing npuops_gateway_vip)" \
        in problems
    assert "host gw02: npuops_node_ip 10.0.0.11 is also the address of node01; every host needs its own" in problems
    assert "npuops_gateway_vip 10.0.0.40 is the address of host gw01; it must be an address no host owns" in problems
    assert "npuops_gateway_mode = 'round_robin' must be one of active_standby, active_active, canary, tenant" \
        in problems


def test_canary_needs_a_weight_per_instance_and_tenant_keys_are_never_named(presets):
    groups, hv = with_gateway(mode="canary", npuops_gateway_weights={"a": 10})
    assert check(groups, hv, presets) == [
        "npuops_gateway_weights = {'a': 10}: canary mode needs a weight (0-256) for every instance, e.g. {a: 90, b: 10}"]
    groups, hv = with_gateway(mode="tenant", npuops_gateway_tenants={"secret-key-0001": "c", "short": "a"})
    problems = check(groups, hv, presets)
    assert problems == [
        "npuops_gateway_tenants: the key of entry 1 (instance a) must be 8 or more characters of "
        "A-Z a-z 0-9 . _ ~ + / = -",
        "npuops_gateway_tenants: entry 2 routes to 'c', which is not an instance (a, b)"]
    assert not any("secret-key-0001" in p or "short" in p.split("(", maxsplit=1)[0] for p in problems)


def test_active_standby_config_sends_to_a_and_keeps_b_as_backup():
    cfg = gw.haproxy_config(plan_of(*with_gateway())["gateway"], "kimi-k3")
    assert ("    server a-1 10.0.0.11:8000 check agent-check agent-port 18710\n"
            "    server b-1 10.0.0.15:8000 check agent-check agent-port 18711 backup\n") in cfg
    assert "    option allbackups\n" in cfg
    # liveness: GET /health, which the engine answers without queueing behind the load (a busy engine stays in);
    # progress: the gateway agent's word, asked on the gateway host itself
    assert "    http-check send meth GET uri /health ver HTTP/1.1 hdr Host npuops-gateway\n" in cfg
    assert "/v1/completions" not in cfg
    assert "    timeout check 1500ms\n" in cfg
    assert ("    default-server inter 1s fastinter 300ms downinter 1s fall 3 rise 2 agent-inter 1s agent-addr 127.0.0.1 "
            "on-marked-down shutdown-sessions\n") in cfg
    assert "    bind 127.0.0.1:8404\n" in cfg
    assert "    stats socket /run/haproxy/admin.sock mode 600 level admin expose-fd listeners\n" in cfg
    assert "\n    log " not in cfg


def test_the_agent_is_configured_for_every_server_with_its_own_port_and_model():
    plan, _specs, _hv = on_other_weights("active_active")
    config = gw.agent_config(plan["gateway"], plan["served_model_name"], "sk-engines")
    assert config["servers"] == [
        {"name": "a-1", "agent_port": 18710, "url": "http://10.0.0.11:8000", "model": "kimi-k3"},
        {"name": "b-1", "agent_port": 18711, "url": "http://10.0.0.15:8000", "model": "k3-v2"}]
    assert config["api_key"] == "sk-engines" and config["stall_seconds"] == 6 and config["bind"] == "127.0.0.1"


def test_a_wedged_engine_is_out_within_10s():
    """The agent says down once nothing stepped for stall_seconds while requests were in flight; it reads the
    metrics every `interval` and HAProxy asks it every agent-inter, taking one "down" as down."""
    worst = gw.AGENT["stall_seconds"] + gw.AGENT["interval"] + float(gw.AGENT["inter"].rstrip("s"))
    assert worst == 8 and worst <= 10


def test_canary_and_active_active_configs():
    groups, hv = with_gateway(mode="canary")
    cfg = gw.haproxy_config(plan_of(groups, hv)["gateway"], "m", {"weights": {"a": 90, "b": 10}})
    assert "    balance roundrobin\n" in cfg
    assert ("    server a-1 10.0.0.11:8000 check agent-check agent-port 18710 weight 90\n"
            "    server b-1 10.0.0.15:8000 check agent-check agent-port 18711 weight 10\n") in cfg
    with pytest.raises(AnsibleFilterError, match="canary mode needs npuops_gateway_weights for b"):
        gw.haproxy_config(plan_of(groups, hv)["gateway"], "m", {"weights": {"a": 90}})
    groups, hv = with_gateway(mode="active_active")
    cfg = gw.haproxy_config(plan_of(groups, hv)["gateway"], "m")
    assert "    balance leastconn\n" in cfg and " backup" not in cfg


def test_tenant_config_routes_by_key_through_a_map_and_holds_no_key():
    tenants = {"key-of-tenant-a": "a", "key-of-tenant-b": "b"}
    g = plan_of(*with_gateway(mode="tenant", npuops_gateway_tenants=tenants))["gateway"]
    cfg = gw.haproxy_config(g, "m")
    assert "    http-request deny deny_status 401 unless npuops_known_key\n" in cfg
    assert "    use_backend %[var(txn.npuops_key),map(/etc/haproxy/npuops-tenants.map)]\n" in cfg
    assert "backend be_a\n" in cfg and "backend be_b\n" in cfg
    assert "key-of-tenant" not in cfg
    assert gw.tenant_map(tenants) == "key-of-tenant-a be_a\nkey-of-tenant-b be_b\n"
    assert gw.gateway_servers_of(g, "b") == [{"backend": "be_b", "server": "b-1"}]


def test_keepalived_config_of_each_gateway_host():
    g = plan_of(*with_gateway())["gateway"]
    first = gw.keepalived_config(g, "gw01", {"nic": "eth0"})
    second = gw.keepalived_config(g, "gw02", {"nic": "eth0", "vrid": 7})
    assert "    priority 150\n" in first and "    priority 100\n" in second
    assert "    unicast_src_ip 10.0.0.40\n    unicast_peer {\n        10.0.0.41\n    }\n" in first
    assert "        10.0.0.250/24 dev eth0\n" in second and "    virtual_router_id 7\n" in second
    with pytest.raises(AnsibleFilterError, match="node01 is not a host of group gateway"):
        gw.keepalived_config(g, "node01", {"nic": "eth0"})


def test_rollout_order_is_one_instance_at_a_time_in_plan_order():
    p = plan_of(*with_gateway())
    assert gw.rollout_order(p, ["b/main", "a/main"]) == [
        {"instance": "a", "groups": ["a/main"], "hosts": ["node01", "node02", "node03", "node04"]},
        {"instance": "b", "groups": ["b/main"], "hosts": ["node05", "node06", "node07", "node08"]}]
    assert gw.rollout_order(p, ["b/main"]) == [
        {"instance": "b", "groups": ["b/main"], "hosts": ["node05", "node06", "node07", "node08"]}]


def test_with_a_gateway_serving_replicas_roll_instead_of_being_refused():
    p = plan_of(*with_gateway())
    key = p["instances"]["a"]["groups"]["main"]["key"]
    hv = dict((h, {"preview": {"action": "recreate", "started_at": "t", "changes": ["image"]}}) for h in p["hosts"])
    d = serve.serve_restarts(hv, p, "preview")
    assert d["rolling"] is True and d["interrupts_service"] is False and d["interrupts"] == ["a", "b"]
    p["gateway"] = None
    d = serve.serve_restarts(hv, p, "preview")
    assert d["rolling"] is False and d["interrupts_service"] is True
    assert key == "a/main"


def on_other_weights(mode, **extra):
    """Two replicas behind a gateway; instance b serves other weights under its own name (the canary of a new
    version): the plan of the plan role, with what each instance serves."""
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model import inventory as inventory_filter
    from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import presets
    groups, hv = with_gateway(mode=mode, **extra)
    for h in groups["npu_nodes"][4:]:
        hv[h].update(npuops_model_dir="/data/models/k3-v2", npuops_model_overrides={"served_model_name": "k3-v2"})
    specs = inventory_filter.instance_specs(groups, hv, presets())
    return topology.plan(groups, hv, tier_spec("4node_dp"), specs), specs, hv


def test_tenant_backends_probe_their_own_model_and_the_mixing_modes_the_services():
    """The agent's idle probe asks each instance for its own model in tenant mode; behind a mixing gateway for the
    service's name, which every instance accepts."""
    tenants = {"key-of-tenant-a": "a", "key-of-tenant-b": "b"}
    plan, _specs, _hv = on_other_weights("tenant", npuops_gateway_tenants=tenants)
    assert plan["served_model_name"] == "kimi-k3" and plan["gateway"]["models"] == {"a": "kimi-k3", "b": "k3-v2"}
    config = gw.agent_config(plan["gateway"], plan["served_model_name"])
    assert [s["model"] for s in config["servers"]] == ["kimi-k3", "k3-v2"]
    cfg = gw.haproxy_config(plan["gateway"], plan["served_model_name"])
    assert cfg.count("http-check send meth GET uri /health") == 2  # one per tenant backend


def test_an_instance_on_other_weights_answers_with_its_name_and_accepts_the_services_only_behind_a_mixing_gateway():
    from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import rendered
    for mode, extra, b_names in (
            ("canary", {"npuops_gateway_weights": {"a": 90, "b": 10}}, ["k3-v2", "kimi-k3"]),
            ("active_standby", {}, ["k3-v2", "kimi-k3"]),
            # tenant mode sends each tenant to its own instance: no name of another
            ("tenant", {"npuops_gateway_tenants": {"key-of-tenant-a": "a", "key-of-tenant-b": "b"}}, "k3-v2")):
        plan, specs, hv = on_other_weights(mode, **extra)
        tier, model, opts = rendered("4node_dp", "kimi_k3_w4a8")
        out = serve.serve_containers(plan, hv, tier, model, dict(opts, instances=specs))
        a, b = out["node01"]["engine"], out["node05"]["engine"]
        assert a["command"][:3] == ["vllm", "serve", "/data/models/k3"], mode
        assert b["command"][:3] == ["vllm", "serve", "/data/models/k3-v2"], mode
        assert "/data/models/k3-v2:/data/models/k3-v2:ro" in out["node08"]["engine"]["mounts"]
        assert not any("k3-v2" in m for m in out["node04"]["engine"]["mounts"])
        flag = b["command"].index("--served-model-name")
        if isinstance(b_names, list):
            assert b["command"][flag + 1:flag + 3] == b_names, mode
            assert b["command"][flag + 3].startswith("--")
        else:
            assert b["command"][flag + 1] == b_names and b["command"][flag + 2].startswith("--"), mode
        flag = a["command"].index("--served-model-name")
        assert a["command"][flag + 1] == "kimi-k3" and a["command"][flag + 2].startswith("--"), mode


REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 8))
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gateway")
# the configurations the Python renderer wrote before the layouts moved into the role's templates (captured from it)
CONFIGS = {
    "haproxy_active_standby.cfg": lambda: (plan_of(*with_gateway())["gateway"], "kimi-k3", {}),
    "haproxy_active_active.cfg": lambda: (plan_of(*with_gateway(mode="active_active"))["gateway"], "kimi-k3", {}),
    "haproxy_canary.cfg": lambda: (plan_of(*with_gateway(mode="canary"))["gateway"], "m",
                                   {"weights": {"a": 90, "b": 10}}),
    "haproxy_tenant.cfg": lambda: (on_other_weights("tenant", npuops_gateway_tenants={
        "key-of-tenant-a": "a", "key-of-tenant-b": "b"})[0]["gateway"], "kimi-k3", {"api_key": "sk-engines-key"}),
    "keepalived_gw01.conf": lambda: (plan_of(*with_gateway())["gateway"], "gw01", {"nic": "eth0"}),
    "keepalived_gw02.conf": lambda: (plan_of(*with_gateway())["gateway"], "gw02",
                                     {"nic": "enp189s0f0", "vrid": 7, "prefix": 16}),
}


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def test_the_role_writes_the_configurations_byte_for_byte_as_before_with_the_template_module(tmp_path):
    """The gateway role's own tasks - ansible.builtin.template over its templates with the filters' values - run by
    ansible-playbook on localhost, write every configuration as the Python renderer wrote it before the layouts
    moved into templates; the filters' preview renderer agrees."""
    cases = dict((name, make()) for name, make in CONFIGS.items())
    tasks = []
    for name, (gateway, arg, options) in cases.items():
        kind = name.split("_", 1)[0]
        tasks.append({"name": "Write %s" % name, "ansible.builtin.template": {
            "src": os.path.join(gw.TEMPLATES, "%s.j2" % ("haproxy.cfg" if kind == "haproxy" else "keepalived.conf")),
            "dest": str(tmp_path / name), "mode": "0600"},
            "vars": {"npuops_%s" % kind: "{{ cases['%s'][0] | npuops.ascend.gateway_%s(cases['%s'][1], cases['%s'][2]) }}"
                     % (name, kind, name, name)}})
    (tmp_path / "play.yml").write_text(json.dumps([{"hosts": "localhost", "connection": "local",
                                                    "gather_facts": False, "tasks": tasks}]))
    (tmp_path / "cases.json").write_text(json.dumps({"cases": dict((n, list(c)) for n, c in cases.items())}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    run = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                          "-e", "@%s" % (tmp_path / "cases.json"), "-e", "ansible_python_interpreter=%s" % sys.executable,
                          str(tmp_path / "play.yml")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    for name, (gateway, arg, options) in cases.items():
        assert (tmp_path / name).read_text() == fixture(name), name
        preview = gw.haproxy_config(gateway, arg, options) if name.startswith("haproxy") else \
            gw.keepalived_config(gateway, arg, options)
        assert preview == fixture(name), name
