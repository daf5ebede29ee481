"""The table of inventory variables (data/inventory_variables.yml) is the inventory's one description: what the table
makes (the plan role's argument spec and README table, docs/inventory.md, the sample inventory) is what it says, every
npuops_* variable a role, playbook, template or plugin reads is a row, and no role states another default, type or
choices than its row. Each failure names the variable, the file and the fix; after changing the table, `make
inventory-vars` rewrites what it makes."""
import ast
import importlib.util
import json
import re
import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.npuops.ascend.plugins.plugin_utils.model import inventory as inv
from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TYPES = {"str", "int", "float", "bool", "path", "dict", "list", "raw"}
SCOPES = {"all", "instance", "host"}
STAGES = {"plan", "preflight", "weights", "deploy", "gateway", "validate", "accuracy", "bench", "monitor", "status",
          "recover", "rollout", "diagnose", "stop", "logs"}
FIELDS = {"type", "elements", "default", "default_text", "default_from", "required", "choices", "values_from",
          "no_log", "scope", "stages", "example", "doc", "section"}
FIX = "add or correct its row in %s and run `make inventory-vars`" % os.path.join(
    "collections/ansible_collections/npuops/ascend/data", "inventory_variables.yml")


def _tool():
    spec = importlib.util.spec_from_file_location("inventory_vars", os.path.join(REPO, "tools", "inventory_vars.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _tool()


@pytest.fixture(scope="module")
def found():
    return tool.scan()


@pytest.fixture(scope="module")
def rows():
    return catalog.inventory_variables()


def test_what_the_table_makes_is_checked_in():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "inventory_vars.py"), "--check"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_check_names_a_stale_file_and_the_command_that_rewrites_it(tmp_path, monkeypatch):
    """--check compares with what the table makes, and says which command rewrites it."""
    # what the tool reads besides the table: the roles' READMEs and hand-written argument specs
    for role in catalog.roles():
        for name in ("README.md", os.path.join("meta", "argument_specs.yml")):
            path = os.path.join(tool.COLLECTION, "roles", role, name)
            if os.path.isfile(os.path.join(REPO, path)):
                os.makedirs(os.path.dirname(str(tmp_path / path)), exist_ok=True)
                (tmp_path / path).write_text(open(os.path.join(REPO, path)).read())
    monkeypatch.setattr(tool, "REPO", str(tmp_path))
    os.makedirs(str(tmp_path / "inventories"))
    for path, text in tool.outputs().items():
        os.makedirs(os.path.dirname(str(tmp_path / path)), exist_ok=True)
        (tmp_path / path).write_text(text)
    assert tool.check() == []
    (tmp_path / tool.DOC).write_text((tmp_path / tool.DOC).read_text().replace("npuops_weights_port", "npuops_port"))
    assert tool.check() == [tool.DOC]
    assert tool.main(["--check"]) == 1


def test_every_row_is_well_formed(rows):
    problems = []
    for name, row in rows.items():
        where = "row %s" % name
        if not name.startswith("npuops_") or set(row) - FIELDS:
            problems.append("%s: unknown fields %s" % (where, sorted(set(row) - FIELDS)))
        if row.get("type") not in TYPES or (row.get("type") == "list") != bool(row.get("elements")):
            problems.append("%s: type %r (lists name their elements)" % (where, row.get("type")))
        if row.get("scope") not in SCOPES or not row.get("stages") or set(row["stages"]) - STAGES:
            problems.append("%s: scope %r, stages %r" % (where, row.get("scope"), row.get("stages")))
        if not isinstance(row.get("doc"), str) or "\n" in row["doc"].strip() or not row["doc"].strip():
            problems.append("%s: doc must be one line" % where)
        said = [k for k in ("default", "default_text", "default_from", "required") if k in row and k != "default_text"]
        if len(said) > 1 or (row.get("required") and row.get("example") is None):
            problems.append("%s: one of default, default_from, required (a required one needs an example): %s"
                            % (where, said))
        if row.get("default_from") not in (None, "tier"):
            problems.append("%s: default_from %r" % (where, row["default_from"]))
        if row.get("choices") and "default" in row:
            values = row["default"] if isinstance(row["default"], list) else [row["default"]]
            if set(values) - set(row["choices"]):
                problems.append("%s: default %r is not among its choices" % (where, row["default"]))
    assert problems == []


def test_every_variable_read_anywhere_is_in_the_table(found, rows):
    """Roles (tasks, defaults, templates), playbooks and plugins: a variable nothing in the code sets is the
    inventory's, and has a row."""
    missing = sorted(tool.inventory_names(found) - set(rows))
    assert missing == [], "\n".join(
        "%s is read by %s but not in the table: %s" % (
            name, ", ".join(sorted(f for files in found["reads"].get(name, {}).values() for f in files)
                            + found["defaults"].get(name, []) + found["options"].get(name, [])), FIX)
        for name in missing)


def test_the_scan_finds_what_a_new_reader_would_read(tmp_path, monkeypatch):
    """The scan is what keeps the table whole: a role's task, a template and a plugin that read a new variable are
    each found, and what a task sets or registers is not taken for the inventory's."""
    collection = tmp_path / tool.COLLECTION
    tasks = collection / "roles" / "gateway" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(
        "- name: Read\n  ansible.builtin.debug:\n    msg: \"{{ npuops_gateway_affinity | default('none') }}\"\n"
        "  when: npuops_gateway_sticky | bool\n  register: npuops_gateway_registered\n"
        "- name: Set\n  ansible.builtin.set_fact:\n    npuops_gateway_fact: \"{{ npuops_gateway_registered.rc }}\"\n")
    templates = collection / "roles" / "monitoring" / "templates"
    templates.mkdir(parents=True)
    (templates / "unit.j2").write_text("{% set npuops_local = 1 %}{{ hostvars[h].npuops_monitor_new }}"
                                       "{{ npuops_local }}\n")
    plugins = collection / "plugins" / "plugin_utils" / "model"
    plugins.mkdir(parents=True)
    (plugins / "inventory.py").write_text("x = setting(hv, h, 'npuops_aisbench')\n")
    (tmp_path / "playbooks").mkdir()
    monkeypatch.setattr(tool, "REPO", str(tmp_path))
    scanned = tool.scan()
    assert tool.inventory_names(scanned) == {"npuops_gateway_affinity", "npuops_gateway_sticky",
                                             "npuops_monitor_new", "npuops_aisbench"}
    assert set(scanned["reads"]["npuops_gateway_affinity"]) == {"gateway"}
    assert set(scanned["reads"]["npuops_monitor_new"]) == {"monitor"}
    assert set(scanned["reads"]["npuops_aisbench"]) == {"plan"}
    assert ("collections/ansible_collections/npuops/ascend/roles/gateway/tasks/main.yml:3", "npuops_gateway_affinity",
            "'none'") in tool.inline_defaults({"npuops_gateway_affinity"})


def test_every_row_is_read_somewhere(found, rows):
    """A row nothing reads any more is a stale promise in the docs and the sample."""
    read = tool.inventory_names(found) | inv.port_variables(catalog.tiers())
    stale = sorted(set(rows) - read)
    assert stale == [], "rows nothing reads: %s; remove them from the table and run `make inventory-vars`" % stale


def test_the_tier_documents_variables_are_rows_that_take_their_default_from_the_tier(rows):
    made = inv.port_variables(catalog.tiers()) - {"npuops_gateway_port"}
    assert sorted(made - set(rows)) == []
    assert sorted(n for n in made if rows[n].get("default_from") != "tier") == []
    assert sorted(n for n, r in rows.items() if r.get("default_from") == "tier" and n not in made) == []


def test_one_role_states_the_defaults_and_every_role_depends_on_it(rows):
    """roles/defaults is the only role with defaults: its inventory.yml is what the table makes (checked above), and
    each of its other files holds the big defaults of rows whose default_text names that file. Every other role lists
    it first among its dependencies, so its tasks, templates and handlers see every default."""
    problems = []
    for role in catalog.roles():
        files = catalog._yaml_files(os.path.join(catalog.ROLES_DIR, role, "defaults", "main"))
        if role != "defaults":
            if files:
                problems.append("role %s states defaults (%s): the table's row is the one place, and roles/defaults "
                                "has it" % (role, ", ".join(os.path.relpath(f, REPO) for f in files)))
            with open(os.path.join(catalog.ROLES_DIR, role, "meta", "main.yml")) as f:
                deps = yaml.safe_load(f).get("dependencies") or []
            if deps[:1] != [{"role": "npuops.ascend.defaults"}]:
                problems.append("role %s does not depend on npuops.ascend.defaults first (meta/main.yml): %s" % (
                    role, deps))
            continue
        for path in files:
            rel = os.path.relpath(path, catalog.COLLECTION_DIR).replace(os.sep, "/")
            for name, value in (catalog._read(path) or {}).items():
                row = rows.get(name)
                if row is None:
                    problems.append("%s: %s is no row of the table" % (rel, name))
                elif os.path.basename(path) == "inventory.yml":
                    if row.get("default", object()) != value:
                        problems.append("%s: %s = %r, the table says %r" % (rel, name, value, row.get("default")))
                elif "default" in row or not (row.get("default_text") or "").endswith(rel):
                    problems.append("%s: %s - its row's default_text must name this file, and the row state no "
                                    "default" % (rel, name))
    assert problems == [], "\n".join(problems + [FIX])


def test_the_argument_specs_agree_with_the_table(rows):
    """Type, elements, choices, no_log and a stated default of every role's option that is an inventory variable."""
    problems = []
    for role in catalog.roles():
        for path in catalog._yaml_files(os.path.join(catalog.ROLES_DIR, role, "meta", "argument_specs")):
            for entry, spec in ((catalog._read(path) or {}).get("argument_specs") or {}).items():
                for name, option in (spec.get("options") or {}).items():
                    row = rows.get(name)
                    if row is None:
                        continue
                    want = {"type": row["type"], "elements": row.get("elements"), "choices": row.get("choices"),
                            "no_log": bool(row.get("no_log"))}
                    have = {"type": option.get("type", "str"), "elements": option.get("elements"),
                            "choices": option.get("choices"), "no_log": bool(option.get("no_log"))}
                    if "default" in option:
                        want["default"], have["default"] = row.get("default"), option["default"]
                    if want != have:
                        problems.append("role %s, entry point %s: %s is %s, the table says %s" % (
                            role, entry, name, json.dumps(have), json.dumps(want)))
    assert problems == [], "\n".join(problems + [FIX])


def test_every_stage_whose_role_or_playbook_reads_a_variable_is_among_its_stages(found, rows):
    problems = []
    for name, by_stage in sorted(found["reads"].items()):
        if name in rows:
            missing = sorted(s for s in by_stage if s and s not in rows[name]["stages"])
            if missing:
                problems.append("%s is read by stage(s) %s (%s), its row lists %s" % (
                    name, ", ".join(missing), ", ".join(sorted(f for s in missing for f in by_stage[s])),
                    rows[name]["stages"]))
    assert problems == [], "\n".join(problems + [FIX])


def test_the_scope_is_the_one_the_validator_enforces(rows):
    """The validator refuses a cluster-wide variable that differs between nodes, and an instance's that differs
    within an instance: their rows say so."""
    assert sorted(n for n in inv.CLUSTER_WIDE if rows[n]["scope"] != "all") == []
    assert sorted(n for n in inv.PER_INSTANCE if rows[n]["scope"] != "instance") == []


def test_the_plan_role_declares_exactly_the_plan_stage_rows(rows):
    with open(os.path.join(REPO, tool.PLAN_SPEC)) as f:
        options = yaml.safe_load(f)["argument_specs"]["main"]["options"]
    assert list(options) == [n for n, r in rows.items() if "plan" in r["stages"]]
    assert options["npuops_gateway_tenants"]["no_log"] and options["npuops_serve_api_key"]["no_log"]
    # the tiers the description lists are every tier document, not the three of an older day
    for tier in catalog.tiers():
        assert tier in options["npuops_tier"]["description"]


def test_the_sample_lists_every_variable_and_its_defaults_are_the_plans(tmp_path, rows):
    """Uncommented, every `# name: default` line of the sample changes nothing the plan makes: the defaults it states
    are the ones the code applies."""
    with open(os.path.join(REPO, tool.SAMPLE)) as f:
        text = f.read()
    for name in rows:
        assert ("\n# %s:" % name in text) or ("\n%s:" % name in text), name
    uncommented = []
    for line in text.splitlines():
        name = line[2:].split(":", 1)[0] if line.startswith("# npuops_") else None
        if name in rows and tool.sample_default(rows[name], name) is not None:
            uncommented.append(line[2:])
        else:
            uncommented.append(line)
    inventory = tmp_path / "sample"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(open(os.path.join(REPO, "inventories", "sample", "hosts.yml")).read())
    (inventory / "group_vars" / "all.yml").write_text("\n".join(uncommented) + "\n")
    assert len([line for line in uncommented if line.startswith("npuops_")]) > 100
    plans = []
    for inventory_dir in (os.path.join(REPO, "inventories", "sample"), str(inventory)):
        out = tmp_path / ("plan-%d.json" % len(plans))
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory_dir,
                               os.path.join(REPO, "playbooks", "plan.yml"), "-e", "plan_output=%s" % out],
                              capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        plans.append(json.loads(out.read_text()))
    assert plans[0] == plans[1]


def test_every_example_inventory_is_listed_in_the_readme_and_the_inventory_reference():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(REPO, "docs", "inventory.md")) as f:
        doc = f.read()
    examples = sorted(d for d in os.listdir(os.path.join(REPO, "inventories"))
                      if d != "sim" and os.path.isfile(os.path.join(REPO, "inventories", d, "hosts.yml")))
    assert "a3-4p4d" in examples and "a3-4node-dspark" in examples and "sample" in examples
    assert [d for d in examples if d not in readme] == []
    assert [d for d in examples if "`inventories/%s`" % d not in doc] == []


INLINE_DEFAULT = re.compile(r"\b(npuops_[a-z0-9_]+)\s*\|\s*default\(\s*([^()]*?)\s*\)")


def inline_default_problems(rows, roots):
    """`npuops_x | default(...)` in a role, playbook or template where the table states x's default: a second
    statement (every role sees roles/defaults; a play's tasks see it through its roles). A literal that disagrees
    was the bug this caught before there was one place: preflight checked ports and packages of a cluster the
    rollout would not build."""
    problems = []
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith((".yml", ".yaml", ".j2")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    for number, line in enumerate(f, 1):
                        for var, literal in INLINE_DEFAULT.findall(line):
                            row = rows.get(var)
                            if row is None or "default" not in row:
                                continue
                            problems.append("%s:%d: %s | default(%s), the table says %r" % (
                                os.path.relpath(path, REPO), number, var, literal, row["default"]))
    return problems


def test_no_task_restates_a_default_of_the_table(rows):
    roots = [os.path.join(REPO, "playbooks"), catalog.ROLES_DIR]
    problems = inline_default_problems(rows, roots)
    assert problems == [], "\n".join(problems + ["drop the inline default: roles/defaults states the table's"])


def test_the_plugins_restate_no_default_of_the_table(rows):
    """Python reads a variable the table gives a default with `setting()` (plugin_utils/model/hostvars.py), which takes the
    row's default: a literal beside `hostvar()` is a second statement that drifts (npuops_gateway_mode and
    npuops_kv_pool were each defaulted in two filters and a role)."""
    problems = ["%s: %s defaults to %s where it is read; the table states %r: read it with setting()" % (
        where, name, default, rows[name]["default"]) for where, name, default in tool.inline_defaults()
        if ".py:" in where and "default" in rows.get(name, {})]
    assert problems == []


def test_setting_takes_the_tables_default_and_the_inventorys_value(rows):
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model.hostvars import setting
    hostvars = {"node01": {"npuops_gateway_mode": "active_active", "npuops_kv_pool": None}}
    assert setting(hostvars, "node01", "npuops_gateway_mode") == "active_active"
    assert setting(hostvars, "node01", "npuops_kv_pool") == "none"  # null in the inventory: the default
    assert setting(hostvars, "node02", "npuops_gateway_port") == 8000  # an unknown host: the default
    overrides = setting(hostvars, "node01", "npuops_model_overrides")
    overrides["max_model_len"] = 1  # a caller's change does not reach the next caller's default
    assert setting(hostvars, "node01", "npuops_model_overrides") == {}
    with pytest.raises(KeyError):
        setting(hostvars, "node01", "npuops_model_dir")  # no default in the table: the caller must say what then


def test_the_inline_default_check_finds_every_restated_default(tmp_path, rows):
    (tmp_path / "main.yml").write_text("x: \"{{ npuops_gateway_install | default(false) | bool }}\"\n"
                                       "y: \"{{ npuops_gateway_install | default(true) | bool }}\"\n"
                                       "z: \"{{ npuops_monitor_prometheus_port | default(other_var) }}\"\n"
                                       "w: \"{{ npuops_model_dir | default('/data') }}\"\n")
    assert rows["npuops_gateway_install"]["default"] is True and "default" not in rows["npuops_model_dir"]
    where = os.path.relpath(str(tmp_path / "main.yml"), REPO)
    assert inline_default_problems(rows, [str(tmp_path)]) == [
        "%s:1: npuops_gateway_install | default(false), the table says True" % where,
        "%s:2: npuops_gateway_install | default(true), the table says True" % where,
        "%s:3: npuops_monitor_prometheus_port | default(other_var), the table says 9090" % where]


def test_the_argument_specs_defaults_are_written_from_the_table(tmp_path, monkeypatch, rows):
    """A hand-written spec's default of a row is what the table makes: a wrong one is corrected, a missing plain one
    is added after the type, a template default (seen at run time from roles/defaults) is not stated."""
    assert rows["npuops_status_token_timeout"]["default"] == 10 and "{{" in rows["npuops_reports_dir"]["default"]
    spec = tmp_path / "argument_specs.yml"
    spec.write_text("argument_specs:\n  main:\n    options:\n"
                    "      npuops_status_token_timeout:\n        type: int\n        default: 11\n"
                    "        description: x\n"
                    "      npuops_status_health_timeout:\n        type: int\n        description:\n          - y\n"
                    "      npuops_reports_dir:\n        type: str\n        default: /tmp\n        description: z\n"
                    "      not_a_row:\n        type: int\n        default: 1\n")
    monkeypatch.setattr(tool, "REPO", str(tmp_path))
    assert yaml.safe_load(tool.render_spec_defaults("argument_specs.yml"))["argument_specs"]["main"]["options"] == {
        "npuops_status_token_timeout": {"type": "int", "default": 10, "description": "x"},
        "npuops_status_health_timeout": {"type": "int", "default": 3, "description": ["y"]},
        "npuops_reports_dir": {"type": "str", "description": "z"},
        "not_a_row": {"type": "int", "default": 1}}


def test_only_the_model_reads_the_inventory():
    """The inventory is read in one package, plugin_utils/model (validated, planned, rendered once); every other
    plugin gets the model's results, or reads what a task registered through plugin_utils/results.registered."""
    plugins = os.path.join(catalog.COLLECTION_DIR, "plugins")
    model = os.path.join(plugins, "plugin_utils", "model")
    readers = {"hostvar", "setting"}
    # results.registered reads a task's registered result with the model's primitive (a host's value, or a default)
    bridge = os.path.join(plugins, "plugin_utils", "results.py")
    problems = []
    for path in tool._files(plugins, (".py",)):
        if path.startswith(model + os.sep) or path == bridge:
            continue
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        where = os.path.relpath(path, REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("model.hostvars"):
                named = sorted(a.name for a in node.names if a.name in readers)
                if named:
                    problems.append("%s:%d imports %s" % (where, node.lineno, ", ".join(named)))
            elif isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "hostvars":
                problems.append("%s:%d reads hostvars[...]" % (where, node.lineno))
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in readers:
                problems.append("%s:%d calls %s()" % (where, node.lineno, node.func.id))
    assert problems == [], "\n".join(problems + ["read the inventory in plugin_utils/model and hand the result on"])


DOC_DEFAULT = re.compile(r"`?(npuops_[a-z0-9_]+)`?[^.;|\n`]{0,12}?,?\s*\(?(?:default|defaults to|by default)\s*(?:is\s+)?"
                         r"(`[^`]+`|-?\d[\d.]*|on|off|true|false|none)(?!\w)", re.I)


def doc_default_problems(rows, paths):
    """`npuops_x ... default <value>` in prose: a second statement of a default the table states (docs/inventory.md,
    the sample and the role READMEs' tables are made from the table and not prose)."""
    problems = []
    for path in paths:
        with open(path) as f:
            text = f.read()
        for m in DOC_DEFAULT.finditer(" ".join(text.split("\n"))):
            row = rows.get(m.group(1))
            if row is not None and "default" in row:
                problems.append("%s: %s (the table states %s)" % (os.path.relpath(path, REPO), m.group(0),
                                                                 json.dumps(row["default"])))
    return problems


def _prose():
    made = set(os.path.join(REPO, p) for p in tool.outputs())
    paths = [os.path.join(REPO, "README.md"), os.path.join(catalog.COLLECTION_DIR, "README.md")]
    paths += [os.path.join(REPO, "docs", f) for f in sorted(os.listdir(os.path.join(REPO, "docs"))) if f.endswith(".md")]
    paths += [os.path.join(catalog.ROLES_DIR, r, "README.md") for r in catalog.roles()]
    return [p for p in paths if os.path.isfile(p) and p not in made]


def test_no_doc_restates_a_default_of_the_table(rows):
    problems = doc_default_problems(rows, _prose())
    assert problems == [], "\n".join(problems + ["say what the default is, not its value: docs/inventory.md has it"])


def test_the_doc_check_finds_a_stated_default(tmp_path, rows):
    page = tmp_path / "page.md"
    page.write_text("Set `npuops_disk_write_mb_s` (default 3000) to your disk's; `npuops_instance` (default `main`)\n"
                    "names it; `npuops_weights_seed`, default the first host; `npuops_model_dir` is required.\n")
    assert [p.split(": ", 1)[1] for p in doc_default_problems(rows, [str(page)])] == [
        "`npuops_disk_write_mb_s` (default 3000 (the table states 3000)",
        "`npuops_instance` (default `main` (the table states \"main\")"]
