"""The inventory variables' table (data/inventory_variables.yml) and what is made from it.

  python tools/inventory_vars.py                    # rewrite what the table makes (make inventory-vars)
  python tools/inventory_vars.py --check            # exit 1 naming each file that is not what the table says
  python tools/inventory_vars.py --inline-defaults  # every default stated where a variable is read, against the table
  python tools/inventory_vars.py --scan             # every inventory variable the code reads, and which stages read it

From the table it writes the plan role's argument spec (roles/plan/meta/argument_specs.yml: the variables the plan
stage reads) and the table of its README, docs/inventory.md and the sample inventory's
inventories/sample/group_vars/all.yml (every variable, commented with its default). The unit stage runs --check
(tests/test_inventory_variables.py), and fails as well when something reads an npuops_* variable the table does not
list (`scan`, `inventory_names`).
"""
import ast
import json
import os
import re
import sys

import jinja2
import jinja2.nodes
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "collections"))

from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog  # noqa: E402

COLLECTION = os.path.relpath(catalog.COLLECTION_DIR, REPO)
COMMAND = "make inventory-vars"
NAME = re.compile(r"^npuops_[a-z0-9_]+$")
# what a role's directory is to an operator: the stage (playbook, tag) that runs it
ROLE_STAGE = {"serve": "deploy", "monitoring": "monitor", "defaults": ""}
# a stage playbook's stem is its stage; site.yml and the simulator's playbooks are none
PLAYBOOK_STAGE = {"plan": "plan", "preflight": "preflight", "weights": "weights", "deploy": "deploy",
                  "gateway": "gateway", "validate": "validate", "accuracy": "accuracy", "bench": "bench",
                  "monitor": "monitor", "status": "status", "recover": "recover", "rollout": "rollout",
                  "diagnose": "diagnose", "stop": "stop", "logs": "logs"}
# the inventory model (validate, plan, render; the plan role runs it): a variable it reads is read by the plan stage
MODEL_PACKAGE = "plugin_utils/model/"
# keys whose string values Ansible reads as bare Jinja expressions
CONDITIONALS = ("when", "failed_when", "changed_when", "until", "that")


# ------------------------------------------------------------------------------------------------- the table

def table():
    return catalog.inventory_variables()


def sections():
    return catalog.load("inventory_variables")["sections"]


# ------------------------------------------------------------------------------------------- what reads what

class _Loader(yaml.SafeLoader):
    """Ansible's YAML with its tags (!unsafe, !vault) read as plain values."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                              if isinstance(node, yaml.ScalarNode) else None)
_JINJA = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])


def _jinja_names(text, expression=False):
    """npuops_* names a template or a bare expression reads (names, attributes, string constants)."""
    source = "{{ (%s) }}" % text if expression else text
    try:
        tree = _JINJA.parse(source)
    except jinja2.TemplateSyntaxError:
        return set()
    out = set()
    for node in tree.find_all((jinja2.nodes.Name, jinja2.nodes.Getattr, jinja2.nodes.Const)):
        if isinstance(node, jinja2.nodes.Name) and node.ctx == "load":
            name = node.name
        elif isinstance(node, jinja2.nodes.Getattr):
            name = node.attr
        elif isinstance(node, jinja2.nodes.Const) and isinstance(node.value, str):
            name = node.value
        else:
            continue
        if NAME.match(name):
            out.add(name)
    return out


def _walk_yaml(value, reads, defines, key=None):
    """Reads (Jinja in any string, bare expressions under CONDITIONALS) and definitions (set_fact, register, vars,
    loop_var) of a task file, a playbook or a defaults file."""
    if isinstance(value, dict):
        for k in ("ansible.builtin.set_fact", "set_fact", "vars"):
            if isinstance(value.get(k), dict):
                defines.update(n for n in value[k] if isinstance(n, str))
        if isinstance(value.get("register"), str):
            defines.add(value["register"])
        control = value.get("loop_control")
        if isinstance(control, dict):
            defines.update(v for k, v in control.items() if k in ("loop_var", "index_var") and isinstance(v, str))
        for k, v in value.items():
            _walk_yaml(v, reads, defines, k)
    elif isinstance(value, list):
        for v in value:
            _walk_yaml(v, reads, defines, key)
    elif isinstance(value, str):
        if key in CONDITIONALS:
            reads.update(_jinja_names(value, expression=True))
        elif "{{" in value or "{%" in value:
            reads.update(_jinja_names(value))


def _files(top, ends):
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(ends):
                yield os.path.join(root, f)


def _python_names(path):
    """npuops_* names a plugin reads: string constants that are a whole variable name."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    return set(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and NAME.match(n.value))


def scan():
    """What the code does with npuops_* variables: {"reads": {name: {stage or '': [files]}}, "defines": {name:
    [files]} (set by a task, registered, bound or a role's or play's vars: nobody's inventory), "defaults": {name:
    [files]} (roles' defaults), "options": {name: [role:entry]} (main entry points' argument specs)}."""
    reads, defines, defaults, options = {}, {}, {}, {}

    def read(names, path, stage):
        for n in names:
            reads.setdefault(n, {}).setdefault(stage, []).append(path)

    def define(names, path, into):
        for n in names:
            if NAME.match(n):
                into.setdefault(n, []).append(path)

    roles_dir = os.path.join(REPO, COLLECTION, "roles")
    for role in sorted(os.listdir(roles_dir)):
        stage = ROLE_STAGE.get(role, role)
        for path in _files(os.path.join(roles_dir, role), (".yml", ".yaml", ".j2")):
            rel = os.path.relpath(path, REPO)
            part = os.path.relpath(path, os.path.join(roles_dir, role)).split(os.sep)[0]
            if part == "meta":
                if path.endswith("argument_specs.yml"):
                    for entry_name, entry in ((_read(path) or {}).get("argument_specs") or {}).items():
                        if entry_name == "main":
                            define(entry.get("options") or {}, "%s:%s" % (role, entry_name), options)
                continue
            if path.endswith(".j2"):
                with open(path) as f:
                    text = f.read()
                read(_jinja_names(text), rel, stage)
                tree = _JINJA.parse(text)
                define([n.name for n in tree.find_all(jinja2.nodes.Name) if n.ctx == "store"], rel, defines)
                continue
            doc = _read(path)
            names, defs = set(), set()
            _walk_yaml(doc, names, defs)
            # a name a file sets (task vars, set_fact) is read there as what the file made of it
            read(names - defs, rel, stage)
            define(defs, rel, defines)
            if part == "defaults" and isinstance(doc, dict):
                define(doc, rel, defaults)
            elif part == "vars" and isinstance(doc, dict):
                define(doc, rel, defines)
    for path in _files(os.path.join(REPO, "playbooks"), (".yml",)):
        names, defs = set(), set()
        _walk_yaml(_read(path), names, defs)
        rel = os.path.relpath(path, REPO)
        read(names - defs, rel, PLAYBOOK_STAGE.get(os.path.basename(path)[:-4], ""))
        define(defs, rel, defines)
    plugins = os.path.join(REPO, COLLECTION, "plugins")
    for sub in ("filter", "action", "plugin_utils", "vars"):
        for path in _files(os.path.join(plugins, sub), (".py",)):
            rel = os.path.relpath(path, plugins)
            read(_python_names(path), os.path.relpath(path, REPO), "plan" if rel.startswith(MODEL_PACKAGE) else "")
    return {"reads": reads, "defines": defines, "defaults": defaults, "options": options}


def _read(path):
    with open(path) as f:
        return yaml.load(f, Loader=_Loader)


def inventory_names(found=None):
    """The names the table must list: every variable a role defaults or declares in a main entry point, and every
    one something reads that no task, register, loop or vars block defines (those are the code's own)."""
    found = found or scan()
    out = set(found["defaults"]) | set(found["options"])
    out.update(n for n in found["reads"] if n not in found["defines"] and n not in NOT_VARIABLES)
    return out


NOT_VARIABLES = {"npuops_sim": "the simulator's Python module (playbooks/sim_up.yml, sim_down.yml)"}


def _balanced(text, start):
    """The text from `start` (just after an opening parenthesis) to its closing one."""
    depth, i = 1, start
    while i < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    return text[start:i - 1]


_JINJA_DEFAULT = re.compile(r"\b(npuops_[a-z0-9_]+)\s*\|\s*(?:default|d)\(")


def _module_constants(path):
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.unparse(node.value)
    return out


def _is_hostvar(node, nargs):
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hostvar" and len(node.args) == nargs


def inline_defaults(names=None):
    """[(file:line, variable, default)] of every default stated where it is read: a Jinja `| default(...)` in a role
    or playbook, a plugin's `hostvar()` call with a default (hostvars, host, name, default). `names` limits it (default: the table)."""
    names = set(table()) if names is None else names
    out = []
    tops = [os.path.join(REPO, COLLECTION, "roles"), os.path.join(REPO, "playbooks")]
    for path in [p for top in tops for p in _files(top, (".yml", ".j2"))]:
        with open(path) as f:
            text = f.read()
        for m in _JINJA_DEFAULT.finditer(text):
            if m.group(1) in names:
                line = text.count("\n", 0, m.start()) + 1
                out.append(("%s:%d" % (os.path.relpath(path, REPO), line), m.group(1),
                            " ".join(_balanced(text, m.end()).split())))
    plugins = os.path.join(REPO, COLLECTION, "plugins")
    modules = dict((os.path.basename(p)[:-3], p) for p in _files(plugins, (".py",)))
    for path in _files(plugins, (".py",)):
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        local = _module_constants(path)
        for node in ast.walk(tree):
            # hostvar() with four arguments (the fourth the default), and hostvar() with three, "or" a default
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and _is_hostvar(node.values[0], 3):
                call, default = node.values[0], ast.BoolOp(op=ast.Or(), values=node.values[1:]) \
                    if len(node.values) > 2 else node.values[1]
            elif _is_hostvar(node, 4):
                call, default = node, node.args[3]
            else:
                continue
            name = call.args[2]
            label = name.value if isinstance(name, ast.Constant) else ast.unparse(name)
            if isinstance(name, ast.Constant) and name.value not in names or \
                    not isinstance(name, ast.Constant) and not re.search(r"var", label):
                continue
            value = ast.unparse(default)
            if isinstance(default, ast.Name) and default.id in local:
                value = "%s = %s" % (default.id, local[default.id])
            elif isinstance(default, ast.Attribute) and getattr(default.value, "id", None) in modules:
                consts = _module_constants(modules[default.value.id])
                if default.attr in consts:
                    value = "%s = %s" % (value, consts[default.attr])
            out.append(("%s:%d" % (os.path.relpath(path, REPO), node.lineno), label, value))
    return out


# ----------------------------------------------------------------------------------------------- rendering

PLAN_SPEC = os.path.join(COLLECTION, "roles", "plan", "meta", "argument_specs.yml")
# the one place a role finds a default: roles/defaults, which every role depends on (meta/main.yml); the big tables
# beside it (presets.yml, matrices.yml) are the defaults of the rows whose default_text names them
DEFAULTS = os.path.join(COLLECTION, "roles", "defaults", "defaults", "main", "inventory.yml")
PLAN_README = os.path.join(COLLECTION, "roles", "plan", "README.md")
DOC = os.path.join("docs", "inventory.md")
SAMPLE = os.path.join("inventories", "sample", "group_vars", "all.yml")
GENERATED = "Written by tools/inventory_vars.py from data/inventory_variables.yml (%s); do not edit." % COMMAND
PLAN_HEADER = {
    "short_description": "Validate the inventory and plan the topology",
    "description": [
        "Checks the whole inventory at once (kubespray validate_inventory style) and fails once with every problem, "
        "each naming the host, the variable, the value and the fix.",
        "Loads the tier document from the collection (data/tiers/<npuops_tier>.yml) and sets npuops_plan (whole "
        "cluster, per instance and engine group), npuops_node (this host), npuops_model_spec (preset plus overrides, "
        "typed), npuops_image_requirement (the image's line of data/images.yml) and npuops_containers (every host's "
        "containers, rendered); refuses a preset the image's vLLM cannot serve, naming the field and the fix.",
        "Types are checked here per host; whether the inventory is complete and consistent (required variables, node "
        "counts, duplicate addresses) is checked once for the whole cluster, with the fix.",
        "The options are the inventory variables the plan stage reads (data/inventory_variables.yml, "
        "docs/inventory.md).",
    ],
}


def _tier_values(name):
    """{value: [tiers]} of a variable the tier documents make (a port, a group's kv_port or node count), and
    {recipe: value} of the recipes that set that port."""
    from ansible_collections.npuops.ascend.plugins.plugin_utils import recipes
    values, by_recipe = {}, {}
    for tier in catalog.tiers().values():
        found = [v for k, v in (tier.get("ports") or {}).items() if "npuops_%s_port" % k == name]
        found += [g["kv_port"] for g in tier["groups"] if g.get("kv_role") and "npuops_%s_kv_port" % g["name"] == name]
        found += [g["nodes"] for g in tier["groups"] if g.get("kv_role") and "npuops_%s_nodes" % g["name"] == name]
        if name == "npuops_proxy_port" and tier.get("proxy"):
            found.append(tier["proxy"].get("port", 8080))
        for v in found:
            values.setdefault(v, []).append(tier["name"])
    for recipe in recipes.names():
        for k, v in (recipes.load(recipe).get("ports") or {}).items():
            if "npuops_%s_port" % k == name and v not in values:
                by_recipe[recipe] = v
    return values, by_recipe


def default_words(row, name):
    """The default of a row as the docs say it, or None."""
    if row.get("no_log") and "default" in row and not row["default"]:
        return "none"
    if "default" in row:
        return row["default_text"] if "{{" in json.dumps(row["default"]) and row.get("default_text") else \
            flow(row["default"])
    if row.get("default_from") == "tier":
        values, by_recipe = _tier_values(name)
        if len(values) == 1:
            text = "the tier's: %s" % next(iter(values))
        else:
            text = "the tier's: " + ", ".join("%s (%s)" % (v, ", ".join(sorted(t))) for v, t in sorted(values.items()))
        return text + "".join("; %s with recipe %s" % (v, r) for r, v in sorted(by_recipe.items()))
    return row.get("default_text")


def flow(value):
    """A value as one line of YAML."""
    if isinstance(value, str) and value and value == value.strip() and "{{" not in value and ": " not in value \
            and " #" not in value and not value.startswith(("#", "'", '"')) and _reads_back(value):
        return value
    if isinstance(value, str):
        return json.dumps(value)  # a double-quoted YAML scalar
    return yaml.safe_dump(value, default_flow_style=True, width=10000).strip().replace("\n...", "")


def _reads_back(text):
    try:
        return yaml.safe_load(text) == text
    except yaml.YAMLError:
        return False


def choices(row):
    return row.get("choices")


def known_values(row):
    """(values, closed) the docs list for a row whose values are the collection's data (tiers, recipes: one of them)
    or presets an inventory may add to; None without values_from."""
    from ansible_collections.npuops.ascend.plugins.plugin_utils import recipes
    source = row.get("values_from")
    if source == "tiers":
        return sorted(catalog.tiers()), True
    if source == "recipes":
        return recipes.names(), True
    if source in ("model_presets", "draft_presets"):
        path = os.path.join(catalog.ROLES_DIR, "defaults", "defaults", "main", "presets.yml")
        return list(_read(path)["npuops_%s" % source]), False
    return None


def describe(row, name, secret_words=True):
    """The row's doc with what the docs add to it: its values, default, requirement."""
    text = " ".join(row["doc"].split())
    if choices(row):
        text += " One of %s." % ", ".join(str(c) for c in choices(row))
    elif known_values(row):
        values, closed = known_values(row)
        text += (" One of %s." if closed else " Shipped: %s.") % ", ".join(values)
    if row.get("no_log") and secret_words:
        text += " Secret: keep it in a vault; it is never logged."
    return text


def render_plan_spec():
    options = {}
    for name, row in table().items():
        if "plan" not in row["stages"]:
            continue
        spec = {"type": row["type"]}
        if row.get("elements"):
            spec["elements"] = row["elements"]
        if "default" in row:
            spec["default"] = row["default"]
        if choices(row):
            spec["choices"] = choices(row)
        if row.get("no_log"):
            spec["no_log"] = True
        text = describe(row, name, secret_words=False)
        if "default" not in row and default_words(row, name):
            text += " Default - %s." % default_words(row, name)
        spec["description"] = text
        options[name] = spec
    doc = {"argument_specs": {"main": dict(PLAN_HEADER, options=options)}}
    lines = ["---", "# " + GENERATED, "argument_specs:", "  main:",
             "    short_description: %s" % flow(PLAN_HEADER["short_description"]), "    description:"]
    for paragraph in PLAN_HEADER["description"]:
        lines += _wrap(paragraph, "      - ", width=118, indent="        ")
    lines.append("    options:")
    for name, spec in options.items():
        lines.append("      %s:" % name)
        for key, value in spec.items():
            if key == "description":
                one = "        description: %s" % flow(value)
                lines += [one] if len(one) <= 118 and yaml.safe_load(flow(value)) == value else \
                    ["        description: >-"] + _wrap(value, "          ")
            else:
                lines.append("        %s: %s" % (key, flow(value)))
    text = "\n".join(lines) + "\n"
    assert yaml.safe_load(text) == doc, "the argument spec's YAML does not read back as written"
    return text


def render_plan_readme():
    """roles/plan/README.md with the table of the main entry point's options made from the table."""
    with open(os.path.join(REPO, PLAN_README)) as f:
        text = f.read()
    head, rest = text.split("### `main`\n\n", 1)
    tail = rest[rest.index("\n\n"):]
    rows = ["| Option | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, row in table().items():
        if "plan" not in row["stages"]:
            continue
        kind = "%s of %s" % (row["type"], row["elements"]) if row.get("elements") else row["type"]
        default = "`%s`" % flow(row["default"]) if "default" in row else (default_words(row, name) or "")
        desc = describe(row, name, secret_words=False)
        if row.get("no_log"):
            desc = "**Secret** (`no_log`): " + desc
        rows.append("| `%s` | %s | %s | %s |" % (name, kind, default.replace("|", "\\|"), desc.replace("|", "\\|")))
    return head + "### `main`\n\n" + "\n".join(rows) + tail


def _example_inventories():
    """[(directory, hosts, first sentence of its hosts.yml's header)] of inventories/ (not sim)."""
    out = []
    top = os.path.join(REPO, "inventories")
    for name in sorted(os.listdir(top)):
        path = os.path.join(top, name, "hosts.yml")
        if name == "sim" or not os.path.isfile(path):
            continue
        with open(path) as f:
            lines = f.read().splitlines()
        header = []
        for line in lines[1:] if lines and lines[0] == "---" else lines:
            if not line.startswith("#"):
                break
            header.append(line[1:].strip())
        sentence = re.split(r"(?<=\.)\s", " ".join(header), 1)[0].rstrip(".")
        out.append((name, _count_hosts(_read(path)), sentence))
    return out


def _count_hosts(node, seen=None):
    seen = set() if seen is None else seen
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "hosts" and isinstance(value, dict):
                seen.update(value)
            else:
                _count_hosts(value, seen)
    return len(seen)


DOC_HEAD = """# Inventory reference

<!-- %s -->

One inventory describes one cluster; the simulated cluster's is written by `make sim-up` to
`inventories/sim/hosts.yml`. `inventories/sample` lists every variable below, commented with its default: copy it
and edit the copy.

| Example | Hosts | What |
|---|---|---|
%s

Every playbook validates the whole inventory first and fails **once**, listing every problem with the
host, the variable, the value it has and what to do (`npuops.ascend.plan`, filter `inventory_model`); a
variable that starts with `npuops_` and is not below is one of them, with the closest name.
`playbooks/plan.yml` does only that plus the plan, and contacts no host.

## Groups

| Group | Who |
|---|---|
| `npu_nodes` | every NPU server of the cluster, in rank order (the first host of a group is its leader) |
| `prefill`, `decode` | prefill/decode tiers only: the hosts of each side (per instance), disjoint, all in `npu_nodes` |
| any group with `npuops_instance` | several instances (replicas) of the tier: every host of `npu_nodes` names its instance (e.g. groups `instance_a`, `instance_b` under `npu_nodes` with `npuops_instance: a` / `b`); see [tiers](tiers.md#instances-replicas) |
| `gateway` | one or two hosts without NPUs, not in `npu_nodes`: HAProxy and keepalived in front of the instances ([gateway](gateway.md)) |
| `monitor` (`npuops_monitor_group`) | the hosts that run Prometheus (default: the first NPU node) ([monitoring](monitoring.md)) |

## Switches and numbers

Booleans (`npuops_preflight_strict`, `npuops_serve_privileged`, `npuops_weights_prewarm`, ...) may be YAML
booleans or the strings Ansible reads as booleans (`-e npuops_serve_privileged=false` means false); anything else
(`flase`) is an error naming the host and the variable. Numbers (timeouts, ports) may be given as numbers or
numeric strings. `npuops_model_overrides` keys must be fields of the preset (a typo lists the known fields), and
each value takes the preset field's type.

## Variables

Scope: **all** - the same on every host; **instance** - the same within an instance, replicas may differ; **host** -
per host. Stages: the playbooks (and `site.yml` tags) that read the variable; **plan** is the validation and the plan
every playbook starts with. Secrets (**secret**) are never logged: keep them in a vault.
"""


def render_doc():
    examples = "\n".join("| `inventories/%s` | %d | %s |" % row for row in _example_inventories())
    out = [DOC_HEAD % (GENERATED, examples)]
    rows = table()
    for section in sections():
        out += ["### %s" % section["title"], "", " ".join(section["doc"].split()), "",
                "| Variable | Type | Default | Scope | Stages | Meaning |", "|---|---|---|---|---|---|"]
        for name in section["variables"]:
            row = rows[name]
            kind = "%s of %s" % (row["type"], row["elements"]) if row.get("elements") else row["type"]
            literal = sample_default(row, name)
            default = "`%s`" % flow(literal[0]) if literal else (default_words(row, name) or "")
            if row.get("required"):
                default = "**required**"
            meaning = describe(row, name, secret_words=False)
            if row.get("example") is not None and not row.get("no_log"):
                meaning += " E.g. `%s`." % flow(row["example"])
            if row.get("no_log"):
                meaning = "**secret**: " + meaning
            out.append("| `%s` | %s | %s | %s | %s | %s |" % (
                name, kind, default.replace("|", "\\|"), row["scope"], ", ".join(row["stages"]),
                meaning.replace("|", "\\|")))
        out.append("")
    return "\n".join(out)


SAMPLE_HEAD = """---
# %s
#
# The sample inventory: every npuops variable, by section, as docs/inventory.md lists them. A line `# name: value`
# is the default (uncomment it to change it); a variable set here is required (replace the example); [per host]
# variables go to hosts.yml or host_vars/<host>.yml, [per instance] ones of replicas to group_vars/<instance
# group>.yml. Copy inventories/sample and edit the copy: hosts.yml names the hosts, their addresses and interfaces.
"""


def sample_default(row, name):
    """The default a sample line states as a value (uncommented, it changes nothing), or None: a literal default that
    is no template, or the one value every tier and recipe gives a tier variable. None for a secret: it belongs in a
    vault, and an empty one is refused (leave it out)."""
    if row.get("no_log"):
        return None
    if "default" in row:
        return None if "{{" in json.dumps(row["default"]) else (row["default"],)
    if row.get("default_from") == "tier":
        values, by_recipe = _tier_values(name)
        if len(values) == 1 and not by_recipe:
            return (next(iter(values)),)
    return None


def render_sample():
    rows = table()
    out = [SAMPLE_HEAD % GENERATED]
    for section in sections():
        out += ["", "# " + "=" * 20 + " " + section["title"], "#"] + _wrap(section["doc"], "# ") + [""]
        for name in section["variables"]:
            row = rows[name]
            words = describe(row, name)
            literal = sample_default(row, name)
            if literal is None and default_words(row, name):
                words += " Default: %s." % default_words(row, name)
            if row.get("required"):
                words += " Required."
            words += {"host": " [per host]", "instance": " [per instance]"}.get(row["scope"], "")
            out += _wrap(words, "# ")
            if row.get("required") and row["scope"] != "host":
                out.append("%s: %s" % (name, flow(row["example"])))
            elif literal is not None:
                out.append("# %s: %s" % (name, flow(literal[0])))
            elif row.get("example") is not None and not row.get("no_log"):
                out.append("# %s: %s  # e.g." % (name, flow(row["example"])))
            else:
                out.append("# %s:" % name)
    return "\n".join(out) + "\n"


def _wrap(text, prefix, width=118, indent=None):
    """Lines of at most `width` characters, the first with `prefix`, the others with `indent` (default: prefix)."""
    words, lines, line = " ".join(text.split()).split(" "), [], ""
    for w in words:
        if line and len(indent if lines and indent else prefix) + len(line) + 1 + len(w) > width:
            lines.append((indent if lines and indent else prefix) + line)
            line = w
        else:
            line = (line + " " + w) if line else w
    if line:
        lines.append((indent if lines and indent else prefix) + line)
    return lines


def render_defaults():
    """roles/defaults' inventory.yml: every row with a default, by section, each with its doc."""
    rows = table()
    out = ["---", "# " + GENERATED, "# Every npuops role depends on this role (meta/main.yml), so its tasks, templates and handlers see these",
           "# defaults; the plugins read the same table (plugin_utils/model/hostvars.setting)."]
    for section in sections():
        names = [n for n in section["variables"] if "default" in rows[n]]
        if not names:
            continue
        out += ["", "# " + "=" * 20 + " " + section["title"]]
        for name in names:
            out += _wrap(describe(rows[name], name), "# ")
            out.append("%s: %s" % (name, flow(rows[name]["default"])))
    text = "\n".join(out) + "\n"
    assert yaml.safe_load(text) == {n: r["default"] for n, r in rows.items() if "default" in r}, \
        "the defaults' YAML does not read back as the table"
    return text


_OPTION = re.compile(r"^(\s+)(npuops_[a-z0-9_]+):\s*$")


def render_spec_defaults(path):
    """A role's hand-written argument spec with the `default:` of every option that is a table row written from the
    table (ansible-doc and the role's README show it): stated when the row has a default that is no template, left
    out otherwise."""
    rows = table()
    with open(os.path.join(REPO, path)) as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        found = _OPTION.match(line)
        if not found or found.group(2) not in rows:
            continue
        row, inner = rows[found.group(2)], found.group(1) + "  "
        body = []
        while i < len(lines) and lines[i].startswith(inner) and lines[i].strip():
            body.append(lines[i])
            i += 1
        body = [b for b in body if not b.startswith(inner + "default:")]
        if "default" in row and "{{" not in json.dumps(row["default"]):
            at = max([k + 1 for k, b in enumerate(body) if b.startswith((inner + "type:", inner + "elements:"))] or [0])
            body.insert(at, "%sdefault: %s" % (inner, flow(row["default"])))
        out += body
    return "\n".join(out)


_MARKUP = re.compile(r"\b([CVOI])\(([^()]*)\)")


def _spec_text(value):
    """An argument spec's description as Markdown: its paragraphs joined, Ansible's C(), V(), O() as code, I() as
    emphasis."""
    text = " ".join(value) if isinstance(value, list) else str(value or "")
    return _MARKUP.sub(lambda m: ("*%s*" if m.group(1) == "I" else "`%s`") % m.group(2), text)


def render_role_readme(role):
    """A role's README with the option table of each entry point made from its argument spec, the Default column
    from the table for a row (the spec's own default otherwise): every README but the plan's (render_plan_readme)."""
    rows = table()
    path = os.path.join(COLLECTION, "roles", role, "README.md")
    with open(os.path.join(REPO, path)) as f:
        text = f.read()
    spec = (_read(os.path.join(REPO, COLLECTION, "roles", role, "meta", "argument_specs.yml")) or {})["argument_specs"]
    for entry, entry_spec in spec.items():
        head = "### `%s`\n\n" % entry
        if head not in text or not entry_spec.get("options"):
            continue
        before, rest = text.split(head, 1)
        lines = rest.split("\n")
        skip = 0
        while skip < len(lines) and lines[skip].startswith("|"):
            skip += 1
        out = ["| Option | Type | Default | Description |", "| --- | --- | --- | --- |"]
        for name, option in entry_spec["options"].items():
            kind = option.get("type", "str")
            if option.get("elements"):
                kind = "%s of %s" % (kind, option["elements"])
            row = rows.get(name)
            if row is not None:
                default = "`%s`" % flow(row["default"]) if "default" in row else (default_words(row, name) or "")
            else:
                default = "`%s`" % flow(option["default"]) if "default" in option else ""
            desc = " ".join(_spec_text(option.get("description")).split())
            if option.get("choices"):
                desc += " Choices: %s." % ", ".join("`%s`" % c for c in option["choices"])
            if option.get("required"):
                desc = "**Required.** " + desc
            if option.get("no_log"):
                desc = "**Secret** (`no_log`): " + desc
            out.append("| `%s` | %s | %s | %s |" % (name, kind, default.replace("|", "\\|"), desc.replace("|", "\\|")))
        text = before + head + "\n".join(out + lines[skip:])
    return text


def role_specs():
    """The argument specs written by hand (every role's but the plan's, which the table makes whole)."""
    out = []
    for role in catalog.roles():
        path = os.path.join(COLLECTION, "roles", role, "meta", "argument_specs.yml")
        if path != PLAN_SPEC and os.path.isfile(os.path.join(REPO, path)):
            out.append(path)
    return out


def outputs():
    """{path relative to the repository: text} of everything the table makes."""
    made = {PLAN_SPEC: render_plan_spec(), PLAN_README: render_plan_readme(), DOC: render_doc(), SAMPLE: render_sample(),
            DEFAULTS: render_defaults()}
    made.update((path, render_spec_defaults(path)) for path in role_specs())
    made.update((os.path.join(COLLECTION, "roles", role, "README.md"), render_role_readme(role))
                for role in catalog.roles() if role not in ("plan", "defaults"))
    return made


def check():
    """The files that are not what the table makes."""
    stale = []
    for path, text in outputs().items():
        try:
            with open(os.path.join(REPO, path)) as f:
                if f.read() == text:
                    continue
        except FileNotFoundError:
            pass
        stale.append(path)
    return stale


def _file_line(entry):
    path, line = entry[0].rsplit(":", 1)
    return path, int(line)


def _literal(text):
    """(value,) of a default written as a Python or Jinja literal, else None."""
    text = re.sub(r",\s*true$", "", text.strip())  # Jinja's default(value, true)
    words = {"true": "True", "false": "False", "none": "None"}
    try:
        return (ast.literal_eval(words.get(text, text)),)
    except (ValueError, SyntaxError):
        return None


def main(argv):
    if "--check" in argv:
        stale = check()
        for path in stale:
            print("%s is not what data/inventory_variables.yml makes: run %s and commit the result" % (path, COMMAND))
        return 1 if stale else 0
    if "--inline-defaults" in argv:
        rows = table()
        for where, name, value in sorted(inline_defaults(inventory_names()), key=_file_line):
            said = _literal(value)
            row = rows.get(name) or {}
            verdict = "" if said is None or "default" not in row else \
                "  (the table's)" if said[0] == row["default"] else "  DIFFERS: the table says %s" % flow(row["default"])
            print("%s  %s  %s%s" % (where, name, value, verdict))
        return 0
    if "--scan" in argv:
        found = scan()
        for name in sorted(inventory_names(found)):
            print(name, sorted(found["reads"].get(name, {})), name in found["defaults"], name in found["options"])
        return 0
    for path, text in outputs().items():
        os.makedirs(os.path.dirname(os.path.join(REPO, path)), exist_ok=True)
        with open(os.path.join(REPO, path), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
