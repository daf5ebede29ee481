# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's data documents: YAML files under ``<collection>/data`` (tiers, image versions), and what its
roles declare: their options (``meta/argument_specs.yml``) and the variables they set.

One source of truth: the inventory validator, the planner, the simulator and the tests all read these files,
from this repository or from an installed collection alike (the path is relative to this file).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import yaml

COLLECTION_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DATA_DIR = os.path.join(COLLECTION_DIR, "data")
ROLES_DIR = os.path.join(COLLECTION_DIR, "roles")
# libyaml's loader where PyYAML has it (ansible-core's own loader uses it too): several times faster
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(name):
    """The document ``data/<name>.yml`` (``name`` may contain a sub-directory, e.g. ``tiers/4node_dp``)."""
    return _read(os.path.join(DATA_DIR, name + ".yml"))


def tiers():
    """{tier name: tier document} of every ``data/tiers/*.yml``."""
    out = {}
    for entry in sorted(os.listdir(os.path.join(DATA_DIR, "tiers"))):
        if entry.endswith(".yml"):
            doc = load("tiers/" + entry[:-4])
            out[doc["name"]] = doc
    return out


def _yaml_files(path):
    """A role's ``<dir>/main.yml`` or the files of ``<dir>/main/`` (Ansible reads either), and ``tasks/*.yml``."""
    if os.path.isfile(path + ".yml"):
        return [path + ".yml"]
    if os.path.isdir(path):
        return [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith((".yml", ".yaml"))]
    return []


def _read(path):
    with open(path) as f:
        return yaml.load(f, Loader=LOADER)


def roles():
    return sorted(r for r in os.listdir(ROLES_DIR) if os.path.isdir(os.path.join(ROLES_DIR, r)))


def role_options():
    """{variable: option spec} of every option of every entry point of every role (meta/argument_specs.yml); an
    option several roles declare has one spec (a test keeps them equal)."""
    out = {}
    for role in roles():
        for path in _yaml_files(os.path.join(ROLES_DIR, role, "meta", "argument_specs")):
            for entry in ((_read(path) or {}).get("argument_specs") or {}).values():
                for name, spec in (entry.get("options") or {}).items():
                    out.setdefault(name, spec)
    return out


def _set_by(tasks, out):
    """Names a task list sets or binds: set_fact keys, register, loop_var, task and include vars; nested blocks."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for key in ("ansible.builtin.set_fact", "set_fact", "vars"):
            if isinstance(task.get(key), dict):
                out.update(k for k in task[key] if k != "cacheable")
        if isinstance(task.get("register"), str):
            out.add(task["register"])
        if isinstance(task.get("loop_control"), dict) and task["loop_control"].get("loop_var"):
            out.add(task["loop_control"]["loop_var"])
        for key in ("block", "rescue", "always"):
            _set_by(task.get(key), out)


def role_variables():
    """Every variable name the roles define themselves: defaults, vars, and what their tasks set or bind."""
    out = set()
    for role in roles():
        base = os.path.join(ROLES_DIR, role)
        for path in _yaml_files(os.path.join(base, "defaults", "main")) + _yaml_files(os.path.join(base, "vars", "main")):
            out.update((_read(path) or {}).keys())
        for path in _yaml_files(os.path.join(base, "tasks")):
            _set_by(_read(path), out)
    return out


def inventory_variables():
    """{name: row} of every inventory variable (``data/inventory_variables.yml``: type, default, scope, stages, doc),
    in the table's order; each row also names its ``section``."""
    out = {}
    for section in load("inventory_variables")["sections"]:
        for name, row in (section.get("variables") or {}).items():
            out[name] = dict(row, section=section["name"])
    return out
