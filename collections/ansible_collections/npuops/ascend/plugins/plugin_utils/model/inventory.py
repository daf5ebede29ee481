# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""validate_inventory: everything wrong with the inventory, before any node is touched.

Kubespray's validate_inventory as one pure function, and the only place the inventory is checked: it returns
every problem at once, each naming the host (when it is per host), the variable, the value it has and what to
do. The tier documents come from the collection (``data/tiers``); the planner trusts what this accepts.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import difflib
import ipaddress
import re

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.plugin_utils.model import topology
from ansible_collections.npuops.ascend.plugins.module_utils import container, vllm_cli
from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog, recipes, speculative, values, versions
from ansible_collections.npuops.ascend.plugins.plugin_utils.model.hostvars import hostvar, setting

ENGINES = container.ENGINES
INSTANCE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# the same on every node of the whole inventory, and the same within each instance (replicas may serve different
# weights: the planning article's canary of a new quantized version on one cluster beside the stable one)
CLUSTER_WIDE = ("npuops_tier", "npuops_container_engine")
PER_INSTANCE = ("npuops_image", "npuops_model", "npuops_model_dir", "npuops_tokenizer_dir", "npuops_recipe",
                "npuops_model_overrides", "npuops_draft", "npuops_draft_dir", "npuops_draft_overrides")


def _ipv4(value):
    try:
        return isinstance(value, str) and ipaddress.ip_address(value).version == 4
    except ValueError:
        return False


def _differs(hosts, hostvars, name, where):
    seen = {}
    for h in hosts:
        seen.setdefault(repr(hostvar(hostvars, h, name)), []).append(h)
    if len(seen) < 2:
        return []
    return ["%s differs between hosts%s (%s); it must be the same on every node%s" % (
        name, where, "; ".join("%s on %s" % (v, ", ".join(hs)) for v, hs in sorted(seen.items())),
        where or " of the cluster")]


def override_problems(preset, overrides):
    """What is wrong with npuops_model_overrides against the preset: unknown keys, values of the wrong type."""
    problems = []
    if not isinstance(overrides, dict):
        return ["npuops_model_overrides = %r must be a mapping, e.g. {max_model_len: 65536}" % (overrides,)]
    for key, value in sorted(overrides.items()):
        if key not in preset:
            problems.append("npuops_model_overrides: %r is not a preset field; the fields are %s"
                            % (key, ", ".join(sorted(preset))))
            continue
        try:
            values.convert_like(preset[key], value)
        except ValueError as e:
            problems.append("npuops_model_overrides: %s = %r: %s (the preset has %r)" % (key, value, e, preset[key]))
    return problems


def model_spec(presets, model, overrides=None, recipe=None):
    """The preset, with the values its recipe's command gives (what runs decides what validate, the benchmark and the
    capacity plan assume), then the inventory's overrides, typed; the validator has refused anything else."""
    preset = dict(presets[model])
    if recipe:
        preset.update(recipes.model_values(recipe, preset))
    for key, value in (overrides or {}).items():
        if key not in preset:
            raise AnsibleFilterError("model_spec: %s" % override_problems(preset, {key: value})[0])
        preset[key] = values.convert_like(preset[key], value)
    return preset


def _instance_problems(tier, name, members, groups, hostvars):
    problems = []
    if name != topology.DEFAULT_INSTANCE and not INSTANCE_NAME.match(name):
        problems.append("npuops_instance = %r (hosts %s) must be a short lowercase name, e.g. a or b"
                        % (name, ", ".join(members)))
    where = " of instance %s" % name if name != topology.DEFAULT_INSTANCE else ""
    label = "instance %s" % name if where else "the inventory"
    if len(members) != int(tier["nodes"]):
        # a prefill/decode tier's count is the sum of its sides' (npuops_<group>_nodes): name them, they are the fix
        sides = " + ".join("%s %d" % (topology.node_count_variable(g), int(g["nodes"])) for g in tier["groups"]
                           if g.get("kv_role"))
        problems.append("npuops_tier %s needs %d hosts per instance in npu_nodes, %s has %d (%s)%s"
                        % (tier["name"], tier["nodes"], label, len(members), ", ".join(members),
                           ": %s; set them to the hosts of each side's group" % sides if sides else ""))
    owner = {}
    for g in tier["groups"]:
        inventory_group = g.get("inventory_group", "npu_nodes")
        ghosts = topology.group_hosts(g, groups, members)
        if len(ghosts) != int(g["nodes"]) and len(members) == int(tier["nodes"]):
            problems.append("npuops_tier %s needs %d hosts in group %s%s, %s has %d (%s)" % (
                tier["name"], g["nodes"], inventory_group, where, label, len(ghosts), ", ".join(ghosts) or "none"))
        for h in ghosts:
            if h in owner:
                problems.append("host %s is in groups %s and %s; a node serves one side"
                                % (h, owner[h], inventory_group))
            owner[h] = inventory_group
    for kind in PER_INSTANCE:
        problems.extend(_differs(members, hostvars, kind, where))
    first = members[0]
    for port_name in sorted(tier.get("ports") or {}):
        var = topology.port_variable(port_name)
        p = values.number_problem(first, var, hostvar(hostvars, first, var, tier["ports"][port_name]), 1, 65535)
        if p:
            problems.append(p)
    for g in tier["groups"]:
        if not g.get("kv_role"):
            continue
        var = topology.kv_port_variable(g)
        value = hostvar(hostvars, first, var, g["kv_port"])
        p = values.number_problem(first, var, value, 1, 65535)
        if p:
            problems.append(p)
        elif tier.get("generation") == "A3" and int(value) < topology.MIN_KV_PORT_A3:
            problems.append("%s = %s%s is inside AscendDirect's random port range on A3 nodes; use %d or higher "
                            "(intermittent 'Address already in use' otherwise)"
                            % (var, value, where, topology.MIN_KV_PORT_A3))
    pool = setting(hostvars, first, "npuops_kv_pool")
    if pool not in topology.KV_POOLS:
        problems.append("npuops_kv_pool = %r%s must be one of %s" % (pool, where, ", ".join(topology.KV_POOLS)))
    elif pool != "none" and not tier.get("kv_pool"):
        problems.append("npuops_kv_pool = %s%s: tier %s has no memcache KV pool (only a prefill/decode tier whose "
                        "recipe publishes one does); set it to none" % (pool, where, tier["name"]))
    elif pool != "none" and hostvar(hostvars, first, "npuops_kv_pool_host") not in [None] + list(hostvars):
        problems.append("npuops_kv_pool_host = %r%s is not a host of the inventory; name the host that runs the "
                        "MetaService (default: the proxy host)" % (hostvar(hostvars, first, "npuops_kv_pool_host"),
                                                                   where))
    if tier.get("proxy"):
        proxy = hostvar(hostvars, first, "npuops_proxy_host")
        if proxy not in hostvars:
            problems.append("npuops_proxy_host = %r%s is not a host of the inventory; name the host that runs the PD "
                            "proxy (the front door)" % (proxy, where))
        var_problem = values.number_problem(first, "npuops_proxy_port", hostvar(
            hostvars, first, "npuops_proxy_port", tier["proxy"].get("port", 8080)), 1, 65535)
        if var_problem:
            problems.append(var_problem)
    return problems


def draft_of(hostvars, host, drafts):
    """The draft one instance runs (its first host's npuops_draft, npuops_draft_overrides and npuops_draft_dir), or
    None. speculative.DraftError names an unknown preset or field."""
    name = setting(hostvars, host, "npuops_draft")
    if not name:
        return None
    return speculative.draft_spec(drafts, name, setting(hostvars, host, "npuops_draft_overrides"),
                                  setting(hostvars, host, "npuops_draft_dir"))


def _draft_problems(hostvars, first, where, drafts, target, itier):
    """The draft of one instance against its target model (the preset with its recipe and overrides) and the engine
    groups of its tier: every rule it breaks (plugin_utils/speculative.py), each naming the instance."""
    try:
        draft = draft_of(hostvars, first, drafts)
    except speculative.DraftError as e:
        return ["%s%s" % (e, where)]
    if draft is None:
        return []
    problems = []
    if not isinstance(draft["dir"], str) or not draft["dir"].startswith("/"):
        problems.append("npuops_draft_dir = %r%s must be an absolute path on the nodes where the draft %s is (or goes), "
                        "e.g. /data/models/%s" % (draft["dir"], where, draft["name"],
                                                  str(draft.get("repo") or "draft").rsplit("/", maxsplit=1)[-1]))
    elif draft["dir"].rstrip("/") == str(hostvar(hostvars, first, "npuops_model_dir") or "").rstrip("/"):
        problems.append("npuops_draft_dir = %s%s is the model directory; the draft is its own checkpoint in its own "
                        "directory" % (draft["dir"], where))
    if target is not None and itier is not None:
        problems.extend(p + where for p in speculative.problems(draft, target.get("max_model_len") or 0,
                                                                itier["groups"]))
    return problems


def image_line(hostvars, host):
    """The vLLM-Ascend line of the host's image (data/images.yml), or None for a tag the table does not know (the
    plan refuses it, naming the table)."""
    return versions.image_versions(hostvar(hostvars, host, "npuops_image"))["line"]


def _model_problems(tier, name, members, hostvars, presets, drafts=None):
    """What one instance serves: its model preset and overrides, its recipe (for the tier), its model and tokenizer
    directories, its draft. -> (problems, the tier with the instance's recipe, or None when it cannot be chosen, and
    that recipe)."""
    first = members[0]
    where = " (instance %s)" % name if name != topology.DEFAULT_INSTANCE else ""
    problems = []
    model = hostvar(hostvars, first, "npuops_model")
    if model not in presets:
        problems.append("npuops_model = %r%s is not a model preset; use one of %s (or add a preset to "
                        "npuops_model_presets)" % (model, where, ", ".join(sorted(presets))))
    else:
        problems.extend(p + where for p in override_problems(
            presets[model], setting(hostvars, first, "npuops_model_overrides")))
    itier = target = recipe = None
    if tier is not None and model in presets:
        try:
            recipe = recipes.choose(setting(hostvars, first, "npuops_recipe") or None, tier["name"], model,
                                    image_line(hostvars, first))
            itier = recipes.tier_with_recipe(tier, recipe)
            if not problems:
                target = model_spec(presets, model, setting(hostvars, first, "npuops_model_overrides"), recipe)
        except recipes.RecipeError as e:
            problems.append("npuops_recipe%s: %s" % (where, e))
    problems.extend(_draft_problems(hostvars, first, where, drafts, target, itier))
    model_dir = hostvar(hostvars, first, "npuops_model_dir")
    if not isinstance(model_dir, str) or not model_dir.startswith("/"):
        problems.append("npuops_model_dir = %r%s must be an absolute path on the nodes, e.g. "
                        "/data/models/Kimi-K3-W4A8" % (model_dir, where))
    tokenizer_dir = setting(hostvars, first, "npuops_tokenizer_dir")
    if not isinstance(tokenizer_dir, str) or (tokenizer_dir and not tokenizer_dir.startswith("/")):
        problems.append("npuops_tokenizer_dir = %r%s must be an absolute path on the nodes (e.g. "
                        "/data/models/Kimi-K3-tokenizer) or empty for the model directory" % (tokenizer_dir, where))
    return problems, itier, recipe


def validate(groups, hostvars, presets, tiers=None, drafts=None, chosen=None):
    """-> list of problem strings (empty when the inventory is fine). `chosen`, a dict, receives the recipe chosen
    for each instance, so that what is read after the check does not choose again."""
    tiers = catalog.tiers() if tiers is None else tiers
    problems = []
    nodes = list(groups.get("npu_nodes", []))
    if not nodes:
        return ["the inventory has no hosts in group npu_nodes; put every NPU server in npu_nodes"]
    first = nodes[0]
    monitor = list(groups.get(setting(hostvars, first, "npuops_monitor_group")) or [])
    planned = sorted(set(nodes) | set(groups.get(topology.GATEWAY_GROUP, [])) | set(monitor))
    problems.extend(variable_problems(planned, hostvars, tiers))
    for h in monitor:
        if h not in nodes and not _ipv4(hostvar(hostvars, h, "npuops_node_ip")):
            problems.append("host %s (group monitor): npuops_node_ip = %r is not an IPv4 address; set it to the "
                            "address Prometheus listens on and scrapes the nodes from"
                            % (h, hostvar(hostvars, h, "npuops_node_ip")))
    for name in CLUSTER_WIDE:
        problems.extend(_differs(nodes, hostvars, name, ""))
    tier_name = hostvar(hostvars, first, "npuops_tier")
    tier = tiers.get(tier_name)
    if tier is None:
        problems.append("npuops_tier = %r is not a tier; set it to one of %s" % (tier_name, ", ".join(sorted(tiers))))
    else:
        count_problems = node_count_problems(tier, nodes, hostvars)
        problems.extend(count_problems)
        tier = None if count_problems else topology.sized(tier, hostvars, first)
        problems.extend(topology.tier_problems(tier) if tier else [])
    instances = topology.instances_of(groups, hostvars)
    instance_tiers = {}
    for name, members in instances.items():
        model_problems, itier, recipe = _model_problems(tier, name, members, hostvars, presets, drafts)
        problems.extend(model_problems)
        instance_tiers[name] = itier
        if chosen is not None and recipe is not None:
            chosen[name] = recipe
    for h in nodes:
        image = hostvar(hostvars, h, "npuops_image")
        if not isinstance(image, str) or not image.strip() or " " in image:
            problems.append("host %s: npuops_image = %r must be an image reference, e.g. "
                            "quay.io/ascend/vllm-ascend:v0.23.0-a3" % (h, image))
            break
    engine = hostvar(hostvars, first, "npuops_container_engine")
    if engine is not None and engine not in ENGINES:
        problems.append("npuops_container_engine = %r must be one of %s" % (engine, ", ".join(ENGINES)))

    named = [h for h in nodes if hostvar(hostvars, h, "npuops_instance") is not None]
    if named and len(named) != len(nodes):
        problems.append("npuops_instance is set on %s but not on %s; give every host of npu_nodes its instance (or "
                        "none: one instance)" % (", ".join(named), ", ".join(h for h in nodes if h not in named)))
    elif tier is not None and not topology.tier_problems(tier):
        for name, members in instances.items():
            problems.extend(_instance_problems(instance_tiers[name] or tier, name, members, groups, hostvars))
        if tier.get("proxy"):
            owners = {}
            for name, members in instances.items():
                owners.setdefault(hostvar(hostvars, members[0], "npuops_proxy_host"), []).append(name)
            for proxy, names in sorted(owners.items(), key=lambda kv: str(kv[0])):
                if proxy is not None and len(names) > 1:
                    problems.append("instances %s all name npuops_proxy_host %s; each instance needs its own proxy "
                                    "host" % (", ".join(names), proxy))
        for g in tier["groups"]:
            stray = [m for m in groups.get(g.get("inventory_group", "npu_nodes"), []) if m not in nodes]
            if stray:
                problems.append("group %s has hosts that are not in npu_nodes: %s"
                                % (g["inventory_group"], ", ".join(stray)))

    problems.extend(gateway_problems(groups, hostvars, nodes, instances))
    problems.extend(address_problems(planned, hostvars))
    problems.extend(instance_group_problems(groups, hostvars, nodes, tier))

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
                problems.append("host %s: npuops_fabric_ip %s is also the address of %s"
                                % (h, fabric, seen_fabric[fabric]))
            else:
                seen_fabric[fabric] = h
        overrides = setting(hostvars, h, "npuops_vllm_overrides")
        if not isinstance(overrides, dict):
            problems.append("host %s: npuops_vllm_overrides = %r must be a mapping of vllm serve options" % (h, overrides))
        else:
            for key in sorted(overrides):
                if key not in vllm_cli.FLAGS:
                    problems.append("host %s: npuops_vllm_overrides: unknown vllm serve option %r%s"
                                    % (h, key, vllm_cli.closest(key)))
    return problems


def address_problems(hosts, hostvars):
    """Two hosts with one ansible_host are one machine: every stage would run twice there and never on the other."""
    seen, problems = {}, []
    for h in hosts:
        seen.setdefault(str(hostvar(hostvars, h, "ansible_host", h)), []).append(h)
    for address, hs in sorted(seen.items()):
        if len(hs) > 1:
            problems.append("hosts %s have the same ansible_host %s: Ansible would reach one machine for all of them; "
                            "give each its own address" % (" and ".join(hs), address))
    return problems


# groups that are no instance: the inventory's structure and the tiers' role groups (prefill/decode span instances)
STRUCTURAL_GROUPS = ("all", "ungrouped", "npu_nodes", topology.GATEWAY_GROUP)


def instance_group_problems(groups, hostvars, nodes, tier):
    """A host listed in two instance groups (instance_a: {vars: {npuops_instance: a}} and instance_b) gets the
    npuops_instance of whichever group Ansible merges last, silently. Seen from the hosts: a group whose hosts
    name one instance, all of that instance's hosts, plus a host that names another; that host is in two."""
    skip = set(STRUCTURAL_GROUPS) | set(g.get("inventory_group", "npu_nodes") for g in (tier or {}).get("groups", []))
    named = dict((h, hostvar(hostvars, h, "npuops_instance")) for h in nodes)
    members = {}
    for h, inst in named.items():
        members.setdefault(inst, set()).add(h)
    problems = []
    for group, hosts in sorted(groups.items()):
        hosts = [h for h in hosts if h in named]
        if group in skip or len(hosts) < 2:
            continue
        counts = {}
        for h in hosts:
            counts[named[h]] = counts.get(named[h], 0) + 1
        owner = max(counts, key=counts.get)
        if len(counts) < 2 or counts[owner] * 2 <= len(hosts) or members[owner] - set(hosts):
            continue
        for h in hosts:
            if named[h] != owner:
                other = [g for g, gh in sorted(groups.items()) if g not in skip and g != group and h in gh]
                problems.append("host %s is in group %s (instance %s) and in %s, so Ansible gave it npuops_instance %s; "
                                "a host belongs to one instance: remove it from one group"
                                % (h, group, owner, " and ".join(other) or "another group", named[h]))
    return problems


def gateway_problems(groups, hostvars, nodes, instances):
    """What is wrong with group ``gateway`` and its settings: hosts, floating address, port, mode, weights, tenants."""
    gw = list(groups.get(topology.GATEWAY_GROUP, []))
    if not gw:
        return []
    problems = []
    both = [h for h in gw if h in nodes]
    if both:
        problems.append("hosts %s are in both gateway and npu_nodes; the gateway runs on hosts of its own"
                        % ", ".join(both))
    if len(gw) > 2:
        problems.append("group gateway has %d hosts (%s); it takes one or two (a pair sharing npuops_gateway_vip)"
                        % (len(gw), ", ".join(gw)))
    first = gw[0]
    node_ips = dict((hostvar(hostvars, h, "npuops_node_ip"), h) for h in nodes)
    for h in gw:
        ip = hostvar(hostvars, h, "npuops_node_ip")
        if ip in node_ips and h not in nodes:
            problems.append("host %s: npuops_node_ip %s is also the address of %s; every host needs its own"
                            % (h, ip, node_ips[ip]))
        node_ips.setdefault(ip, h)
        if not _ipv4(ip):
            problems.append("host %s: npuops_node_ip = %r is not an IPv4 address; set it to the gateway host's own "
                            "address on npuops_nic (VRRP runs between the two)" % (h, ip))
        nic = hostvar(hostvars, h, "npuops_nic")
        if not isinstance(nic, str) or not nic.strip() or len(nic) > 15 or " " in nic:
            problems.append("host %s: npuops_nic = %r must name the interface that carries npuops_gateway_vip" % (h, nic))
    vip = hostvar(hostvars, first, "npuops_gateway_vip")
    if not _ipv4(vip):
        problems.append("npuops_gateway_vip = %r is not an IPv4 address; set it to a free address in the gateway "
                        "hosts' subnet: the floating address that is the service's endpoint" % (vip,))
    elif vip in node_ips:
        problems.append("npuops_gateway_vip %s is the address of host %s; it must be an address no host owns"
                        % (vip, node_ips[vip]))
    p = values.number_problem(first, "npuops_gateway_port", setting(hostvars, first, "npuops_gateway_port"),
                              1, 65535)
    if p:
        problems.append(p)
    mode = setting(hostvars, first, "npuops_gateway_mode")
    if mode not in topology.GATEWAY_MODES:
        problems.append("npuops_gateway_mode = %r must be one of %s" % (mode, ", ".join(topology.GATEWAY_MODES)))
    if len(instances) < 2 and mode in ("active_standby", "canary", "tenant"):
        problems.append("npuops_gateway_mode %s needs two or more instances (npuops_instance); the inventory has %d"
                        % (mode, len(instances)))
    if mode == "canary":
        weights = hostvar(hostvars, first, "npuops_gateway_weights")
        if not isinstance(weights, dict) or sorted(weights) != sorted(instances):
            example = ", ".join("%s: %d" % (n, 90 if i == 0 else 10) for i, n in enumerate(instances))
            problems.append("npuops_gateway_weights = %r: canary mode needs a weight (0-256) for every instance, "
                            "e.g. {%s}" % (weights, example))
        else:
            for name, w in sorted(weights.items()):
                wp = values.number_problem(first, "npuops_gateway_weights.%s" % name, w, 0, 256)
                if wp:
                    problems.append(wp)
    if mode == "tenant":
        tenants = hostvar(hostvars, first, "npuops_gateway_tenants")
        # the keys are secrets: a problem names the instance and the position, never the key
        if not isinstance(tenants, dict) or not tenants:
            problems.append("npuops_gateway_tenants must map each tenant's API key to an instance (from a vault) in "
                            "tenant mode")
        else:
            for pos, (key, inst) in enumerate(sorted(tenants.items(), key=lambda kv: str(kv[1]))):
                if inst not in instances:
                    problems.append("npuops_gateway_tenants: entry %d routes to %r, which is not an instance (%s)"
                                    % (pos + 1, inst, ", ".join(instances)))
                if not isinstance(key, str) or len(key) < 8 or not re.match(r"^[A-Za-z0-9._~+/=-]+$", key):
                    problems.append("npuops_gateway_tenants: the key of entry %d (instance %s) must be 8 or more "
                                    "characters of A-Z a-z 0-9 . _ ~ + / = -" % (pos + 1, inst))
    return problems


def port_variables(tiers):
    """The port variables the tier documents make (npuops_<port>_port, npuops_<group>_kv_port), and the proxy's;
    the validator checks their ranges per instance."""
    names = {"npuops_proxy_port", "npuops_gateway_port"}
    for tier in tiers.values():
        names.update(topology.port_variable(name) for name in tier.get("ports") or {})
        names.update(topology.kv_port_variable(g) for g in tier["groups"] if g.get("kv_role"))
        names.update(topology.node_count_variable(g) for g in tier["groups"] if g.get("kv_role"))
    return names


def known_variables(tiers):
    """Every npuops_* variable something reads: the table of inventory variables, the roles' options and their own
    variables (catalog), and the port variables of the tier documents."""
    return set(catalog.inventory_variables()) | set(catalog.role_options()) | catalog.role_variables() | \
        port_variables(tiers)


def _where(hosts):
    return ("host %s" if len(hosts) == 1 else "hosts %s") % ", ".join(hosts)


def type_problem(name, value, spec):
    """What is wrong with an option's value against its argument spec (type, choices), or None. Strings that
    Ansible converts (`-e name=false`, `-e port=8000`) are accepted as the role's argument validation does."""
    kind = spec.get("type", "str")
    if kind == "bool":
        try:
            values.to_bool(value)
        except ValueError:
            return ("%s = %r is not a boolean; write true or false (in YAML, or JSON on the command line: "
                    "-e '{\"%s\": false}')" % (name, value, name))
    elif kind in ("int", "float"):
        try:
            number = values.to_number(value, int if kind == "int" else float)
        except ValueError:
            return "%s = %r is not %s" % (name, value, "an integer" if kind == "int" else "a number")
        if number < 0:
            return "%s = %s must not be negative" % (name, number)
    elif kind == "dict" and not isinstance(value, dict):
        return "%s = %r must be a mapping" % (name, value)
    elif kind == "list" and not isinstance(value, (list, tuple)):
        return "%s = %r must be a list" % (name, value)
    elif kind in ("str", "path") and not isinstance(value, (str, int, float)):
        return "%s = %r must be a string" % (name, value)
    if spec.get("choices") and kind == "list":
        # a list option's choices are its items' (Ansible's argument spec reads them so)
        for item in value:
            if item not in spec["choices"]:
                return "%s: %r must be one of %s" % (name, item, ", ".join(str(c) for c in spec["choices"]))
    elif spec.get("choices") and value not in spec["choices"]:
        return "%s = %r must be one of %s" % (name, value, ", ".join(str(c) for c in spec["choices"]))
    return None


def variable_problems(hosts, hostvars, tiers):
    """Unknown npuops_* variables (a misspelt setting is silently ignored otherwise: npuops_servce_api_key leaves
    the service without a key), each with the closest known name, as kubespray refuses removed variables; values of
    the wrong type for their role's argument spec; an empty API key. Each problem once, naming its hosts."""
    ports = port_variables(tiers)
    options = dict((k, v) for k, v in catalog.role_options().items() if k not in ports)
    known = known_variables(tiers)
    unknown, wrong = {}, {}
    for h in hosts:
        try:
            names = sorted(n for n in hostvars[h].keys() if str(n).startswith("npuops_"))
        except (KeyError, AttributeError):
            continue
        for name in names:
            value = hostvar(hostvars, h, name)
            if name not in known:
                unknown.setdefault(name, []).append(h)
            elif name == "npuops_serve_api_key" and value is not None and not str(value).strip():
                wrong.setdefault("npuops_serve_api_key is empty: set the key the service is to require (from a vault), "
                                 "or leave the variable out for a service without one", []).append(h)
            elif name in options and value is not None:
                p = type_problem(name, value, options[name])
                if p:
                    wrong.setdefault(p, []).append(h)
    problems = []
    for name, where in sorted(unknown.items()):
        close = difflib.get_close_matches(name, sorted(known), 1, 0.75)
        problems.append("%s: %s is not an npuops variable (nothing reads it)%s" % (
            _where(where), name, "; did you mean %s?" % close[0] if close else
            "; correct or remove it (docs/inventory.md lists the variables)"))
    problems.extend("%s: %s" % (_where(where), p) for p, where in sorted(wrong.items()))
    return problems


def node_count_problems(tier, nodes, hostvars):
    """``npuops_<group>_nodes`` of a prefill/decode group (xPyD): a whole number from 1 to 64, the same on every host."""
    out = []
    for g in tier.get("groups") or []:
        if not g.get("kv_role"):
            continue
        var = topology.node_count_variable(g)
        differs = _differs(nodes, hostvars, var, "")
        if differs:
            out.extend(differs)
            continue
        p = values.number_problem(nodes[0], var, hostvar(hostvars, nodes[0], var, g["nodes"]), 1, 64)
        if p:
            out.append(p)
    return out


def plan_problems(plan):
    """What only the plan shows: a PD proxy on one of its own engine's ports (the ports come from the tier, the
    recipe and the inventory together)."""
    problems = []
    for name, inst in sorted(plan["instances"].items()):
        proxy = inst.get("proxy")
        engine = plan["hosts"].get(proxy["host"]) if proxy else None
        if engine and proxy["port"] in engine["engine_ports"]:
            problems.append("npuops_proxy_port %d (instance %s) collides with the engine's own ports on %s; "
                            "pick another" % (proxy["port"], name, proxy["host"]))
    return problems


def validate_inventory(groups, hostvars, presets, drafts=None):
    """Every problem of the inventory, the plan's included."""
    return inventory_model(groups, hostvars, presets, drafts)["problems"]


def tier_document(name, recipe=None, hostvars=None, host=None):
    """The tier document ``data/tiers/<name>.yml`` of the collection, with the ports the recipe's source gives as
    its defaults (the inventory's npuops_<name>_port still wins) and, given the inventory's ``hostvars`` and a host
    of npu_nodes, the prefill/decode node counts it sets (``npuops_<group>_nodes``, the same on every host)."""
    tiers = catalog.tiers()
    if name not in tiers:
        raise AnsibleFilterError("tier_document: %r is not a tier; the tiers are %s" % (name, ", ".join(sorted(tiers))))
    tier = recipes.tier_with_recipe(tiers[name], recipe)
    return topology.sized(tier, hostvars, host) if hostvars is not None and host else tier


def instance_specs(groups, hostvars, presets, drafts=None, chosen=None):
    """{instance: what it serves}, from the variables of its first host (the validator has checked they are the same
    on each of its hosts): model (the preset's name), model_spec, model_overrides, served_model_name, model_dir,
    tokenizer_dir, image, recipe (the document) and tier (the tier document with that recipe's ports). Replicas may
    serve different weights; one instance's values are the old cluster-wide ones. `chosen`: {instance: recipe} the
    validator chose (inventory_model), else each recipe is chosen here."""
    out = {}
    for name, members in topology.instances_of(groups, hostvars).items():
        first = members[0]
        tier_name, model = hostvar(hostvars, first, "npuops_tier"), hostvar(hostvars, first, "npuops_model")
        if model not in presets:
            raise AnsibleFilterError("instance_specs: npuops_model = %r (instance %s) is not a model preset" % (model, name))
        try:
            recipe = (chosen or {}).get(name) or recipes.choose(
                setting(hostvars, first, "npuops_recipe") or None, tier_name, model, image_line(hostvars, first))
        except recipes.RecipeError as e:
            raise AnsibleFilterError("instance_specs: instance %s: %s" % (name, e))
        overrides = setting(hostvars, first, "npuops_model_overrides")
        spec = model_spec(presets, model, overrides, recipe)
        try:
            # the draft rides in the model spec: the capacity plan counts it, the engines' command renders it
            spec["draft"] = draft_of(hostvars, first, drafts)
        except speculative.DraftError as e:
            raise AnsibleFilterError("instance_specs: instance %s: %s" % (name, e))
        out[name] = {"draft": spec["draft"], "model": model, "model_spec": spec, "model_overrides": overrides,
                     "served_model_name": spec.get("served_model_name"),
                     "model_dir": hostvar(hostvars, first, "npuops_model_dir"),
                     "tokenizer_dir": setting(hostvars, first, "npuops_tokenizer_dir"),
                     "image": hostvar(hostvars, first, "npuops_image"),
                     "recipe": recipe, "tier": tier_document(tier_name, recipe, hostvars, first)}
    return out


def inventory_model(groups, hostvars, presets, drafts=None):
    """The inventory read once for a run: -> {problems, instances, tier, plan}. `problems`: everything wrong with it
    (validate, then plan_problems over the plan: the plan is made once, and only from a sound inventory); when
    nothing is, `instances` (instance_specs, from the recipes the check chose), `tier` (the
    first instance's tier document: the service's) and `plan` (plan_topology over them); otherwise those are None,
    since a plan of a wrong inventory would only fail elsewhere."""
    chosen = {}
    problems = validate(groups, hostvars, presets, drafts=drafts, chosen=chosen)
    if problems:
        return {"problems": problems, "instances": None, "tier": None, "plan": None}
    specs = instance_specs(groups, hostvars, presets, drafts, chosen)
    tier = next(iter(specs.values()))["tier"]
    plan = topology.plan_topology(groups, hostvars, tier, specs)
    problems = plan_problems(plan)
    if problems:
        return {"problems": problems, "instances": None, "tier": None, "plan": None}
    return {"problems": [], "instances": specs, "tier": tier, "plan": plan}
