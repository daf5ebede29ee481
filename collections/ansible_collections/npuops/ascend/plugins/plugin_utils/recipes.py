# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Recipes (``data/recipes/*.yml``): validated launch configurations exactly as their sources publish them, and the
deviations table (``data/deviations.yml``): everything npuops adds or changes on top, each row with its reason.

A recipe's commands keep the source's shell variables (``$MODEL_PATH``, ``${local_ip}``, ``$2``); ``bind`` replaces
each with the plan's value the recipe names (``variables``), ``command_spec`` reads the bound command back into a
``vllm_cli`` spec (the inverse of ``vllm_cli.render``), and ``compare`` names every difference between the recipe and
what a host will run, flag by flag and key by key, each with where it comes from: a deviation row, an operator
override, or nothing (which a test refuses).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import json
import os
import re
import shlex

from ansible_collections.npuops.ascend.plugins.module_utils import vllm_cli
from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog, versions

# `$NAME`, `${NAME}`, the positional `$1`..`$9` of a launch script, and `<NAME>` placeholders
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\d|[A-Za-z_]\w*)|<([A-Z][A-Z0-9_]*)>")
FLAG_KEYS = dict((flag, (key, kind)) for key, (flag, kind) in vllm_cli.FLAGS.items())


class RecipeError(ValueError):
    pass


def names():
    return sorted(f[:-4] for f in os.listdir(os.path.join(catalog.DATA_DIR, "recipes")) if f.endswith(".yml"))


def load(name):
    if name not in names():
        raise RecipeError("recipe %r is not one of %s (data/recipes)" % (name, ", ".join(names())))
    return resolve(catalog.load("recipes/" + name), lambda base: catalog.load("recipes/" + base))


def resolve(doc, load_raw):
    """A recipe document as it runs. A source that publishes a configuration as another one with some values changed
    (the Kimi-K3 page's 1M-context note: "Change the following parameters on every node") is a recipe with ``base``
    (that recipe's name) and ``changes`` ({flag: value}): the base's roles with each flag's value replaced in every
    command, the derived document's own fields (name, source, tier, ...) over the base's. Each flag must appear once
    in each command: a base whose command changed is an error, not a silent mismatch."""
    if not doc.get("base"):
        return doc
    where = "recipe %s" % doc.get("name")
    if doc["base"] not in names():
        raise RecipeError("%s: base %r is not one of %s (data/recipes)" % (where, doc["base"], ", ".join(names())))
    base = load_raw(doc["base"])
    if base.get("base"):
        raise RecipeError("%s: base %s is itself derived; derive from a published recipe" % (where, doc["base"]))
    out = copy.deepcopy(base)
    out.update(doc)
    out["roles"] = dict((role, dict(spec, command=changed(spec["command"], doc.get("changes") or {},
                                                          "%s, role %s" % (where, role))))
                        for role, spec in base["roles"].items())
    return out


def changed(command, changes, where):
    """``command`` with the value of each flag of ``changes`` replaced (``--flag value`` or ``--flag=value``)."""
    for flag, value in changes.items():
        pattern = re.compile(r"(?<!\S)(%s)([ =])(\S+)" % re.escape(flag))
        if len(pattern.findall(command)) != 1:
            raise RecipeError("%s: %s appears %d times in the base's command, a change needs it once"
                              % (where, flag, len(pattern.findall(command))))
        command = pattern.sub(lambda m: m.group(1) + m.group(2) + str(value), command)
    return command


def deviations():
    return catalog.load("deviations")["deviations"]


def all_recipes():
    """{name: recipe document} of every data/recipes/*.yml."""
    raw = dict((name, catalog.load("recipes/" + name)) for name in names())
    return dict((name, resolve(doc, raw.get)) for name, doc in raw.items())


def default_for(tier, model, docs=None):
    """The recipe a tier + model preset gets when the inventory names none and the image's line is not known, or
    None."""
    for name, doc in sorted((docs if docs is not None else all_recipes()).items()):
        if doc.get("default") and doc["tier"] == tier and model in (doc.get("models") or []):
            return name
    return None


def _lines_text(doc):
    return "vLLM-Ascend %s" % ", ".join(str(x) for x in doc.get("lines") or []) if doc.get("lines") else "no line named"


def _newest(doc):
    ranks = [versions.line_rank(x) for x in doc.get("lines") or []]
    return max([r for r in ranks if r is not None] or [-1])


def _oldest(doc):
    ranks = [versions.line_rank(x) for x in doc.get("lines") or []]
    return min([r for r in ranks if r is not None] or [-1])


def _for_line(name, doc, line):
    """The recipe as chosen for an image of `line`: -> (doc with ``selection`` {line, note}); RecipeError when the
    line is older than the recipe allows or falls between its lines."""
    rank = versions.line_rank(line)
    selection = {"line": line, "note": None}
    if rank is None or not doc.get("lines") or str(line) in [str(x) for x in doc["lines"]]:
        return dict(doc, selection=selection)
    if rank > _newest(doc):
        selection["note"] = ("the image's vLLM-Ascend line %s is newer than every line recipe %s was validated on (%s): "
                             "it plans with it, the newest recipe that fits" % (line, name, _lines_text(doc)))
        return dict(doc, selection=selection)
    raise RecipeError("recipe %s was validated on %s; the image's line %s is %s: use an image of %s, or another "
                      "recipe" % (name, _lines_text(doc), line, "older" if rank < _oldest(doc) else "not one of them",
                                  " or ".join(str(x) for x in doc["lines"])))


def choose(name, tier, model, line=None):
    """The recipe document the inventory chooses (``npuops_recipe``), else the recipe of the tier + preset that was
    validated on the image's vLLM-Ascend line (``line``, from data/images.yml); an image newer than every such recipe
    plans with the newest one (said in ``selection.note``); an older one, or one between the recipes' lines, is
    refused naming both. Without a known line, the tier + preset's default. -> the document with ``selection``
    {line, note}."""
    docs = all_recipes()
    if name:
        if name not in docs:
            raise RecipeError("recipe %r is not one of %s (data/recipes)" % (name, ", ".join(sorted(docs))))
        doc = docs[name]
        if doc["tier"] != tier:
            raise RecipeError("npuops_recipe %s is a recipe for tier %s, the inventory's tier is %s; use one of %s"
                              % (name, doc["tier"], tier,
                                 ", ".join(n for n, d in sorted(docs.items()) if d["tier"] == tier) or "none"))
        return _for_line(name, doc, line)
    fitting = dict((n, d) for n, d in docs.items() if d["tier"] == tier and model in (d.get("models") or []))
    if versions.line_rank(line) is None or not fitting:
        name = default_for(tier, model, docs)
        if name is None:
            raise RecipeError("no recipe is the default for tier %s with model preset %s; set npuops_recipe to one of "
                              "%s (docs/recipes.md)" % (tier, model, ", ".join(sorted(docs))))
        return dict(docs[name], selection={"line": line, "note": None})
    on_line = sorted(n for n, d in fitting.items() if str(line) in [str(x) for x in d.get("lines") or []])
    if on_line:
        # several recipes of one line: the tier's default among them
        name = ([n for n in on_line if fitting[n].get("default")] or on_line)[0]
        return dict(fitting[name], selection={"line": line, "note": None})
    newest = max(sorted(fitting), key=lambda n: (_newest(fitting[n]), bool(fitting[n].get("default"))))
    if versions.line_rank(line) > _newest(fitting[newest]):
        return _for_line(newest, fitting[newest], line)
    oldest = min(_oldest(d) for d in fitting.values())
    raise RecipeError("no recipe of tier %s for model preset %s was validated on the image's vLLM-Ascend line %s%s: "
                      "%s; use an image of one of those lines (data/images.yml), or name a recipe in npuops_recipe"
                      % (tier, model, line, " (older than every one of them)" if versions.line_rank(line) < oldest
                         else "", "; ".join("%s (%s)" % (n, _lines_text(d)) for n, d in sorted(fitting.items()))))


def model_values(recipe, preset):
    """The preset fields the recipe's command sets (its first role's, read with every variable at 0): served name,
    lengths, memory, parsers, caching, graph mode."""
    role = sorted(recipe["roles"])[0]
    names = set(VARIABLE.findall(recipe["roles"][role]["command"]))
    zero = dict((n, "0") for triple in names for n in triple if n)
    spec = command_spec(bind(recipe["roles"][role]["command"], zero, recipe["name"]), recipe["name"])
    out = dict((k, spec[k]) for k in preset if k in spec and k in vllm_cli.FLAGS and k != "model")
    cudagraph = (spec.get("compilation_config") or {}).get("cudagraph_mode")
    if "cudagraph_mode" in preset:
        out["cudagraph_mode"] = cudagraph
    if "kv_cache_dtype" in preset and "kv_cache_dtype" not in spec:
        out["kv_cache_dtype"] = "auto"
    return out


def tier_with_recipe(tier, recipe):
    """The tier with the recipe's port defaults (the values its source gives, e.g. the tutorial's RPC_PORT=13345)."""
    if not recipe or not recipe.get("ports"):
        return tier
    out = dict(tier)
    out["ports"] = dict(tier.get("ports") or {}, **recipe["ports"])
    return out


def bind(text, values, where, strict=True):
    """``text`` with every variable replaced by its value. An unbound variable is an error naming it, or, with
    ``strict`` false (environment values, which a deviation row may remove), stays as the source wrote it."""
    def one(m):
        var = m.group(1) or m.group(2) or m.group(3)
        if var not in values or values[var] is None:
            if not strict:
                return m.group(0)
            raise RecipeError("%s: the variable %s has no value (recipe variables: %s)"
                              % (where, m.group(0), ", ".join(sorted(values))))
        return str(values[var])
    return VARIABLE.sub(one, str(text))


SHELL_EXPANSION = re.compile(r"\$\{[^}]*\}")


def unbound(text):
    """The variables still in a value (after strict=False binding), shell expansions such as ${PATH:-} included: a
    container's environment is not expanded by a shell."""
    return [m.group(0) for m in VARIABLE.finditer(str(text))] + SHELL_EXPANSION.findall(str(text))


SETUP_WRAPPER = "npuops-recipe-setup"


def setup_argv(recipe, role):
    """The shell lines a recipe's source runs before its command (`source .../set_env.sh`: the CANN toolkit's and
    vllm-ascend's custom operators' environment), as the prefix of the container's command - bash runs them, each
    must succeed, then execs the command with its argv intact - or [] when the recipe has none."""
    lines = list(recipe.get("setup") or []) + list(((recipe.get("roles") or {}).get(role) or {}).get("setup") or [])
    if not lines:
        return []
    return ["/bin/bash", "-c", " && ".join(lines) + ' && exec "$@"', SETUP_WRAPPER]


def flag_key(flag):
    """The vllm_cli spec key of a flag as a source writes it (vLLM accepts --a_b for --a-b)."""
    name = flag.split("=", 1)[0]
    name = "--" + name[2:].replace("_", "-")
    if name in FLAG_KEYS:
        return FLAG_KEYS[name]
    if name.startswith("--no-") and ("--" + name[5:]) in FLAG_KEYS and FLAG_KEYS["--" + name[5:]][1] == "toggle":
        return FLAG_KEYS["--" + name[5:]][0], "toggle-off"
    raise RecipeError("flag %s is not in vllm_cli.FLAGS%s" % (name, vllm_cli.closest(name[2:].replace("-", "_"))))


def command_spec(command, where):
    """A `vllm serve` command line (one string, shell-quoted as a source writes it) -> vllm_cli spec."""
    argv = shlex.split(command.replace("\\\n", " "))
    if argv[:2] != ["vllm", "serve"] or len(argv) < 3 or argv[2].startswith("--"):
        raise RecipeError("%s: the command must start with `vllm serve <model>`" % where)
    spec = {"model": argv[2]}
    i = 3
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            raise RecipeError("%s: %r is not a flag" % (where, token))
        key, kind = flag_key(token)
        inline = token.split("=", 1)[1] if "=" in token else None
        if kind in ("flag", "toggle"):
            spec[key] = True
            i += 1
            continue
        if kind == "toggle-off":
            spec[key] = False
            i += 1
            continue
        if kind == "names" and inline is None:
            # nargs="+": every word up to the next flag (one name stays a string, as sources write it)
            end = i + 1
            while end < len(argv) and not argv[end].startswith("--"):
                end += 1
            if end == i + 1:
                raise RecipeError("%s: %s needs a value" % (where, token))
            spec[key] = argv[i + 1] if end == i + 2 else argv[i + 1:end]
            i = end
            continue
        if inline is None:
            if i + 1 >= len(argv):
                raise RecipeError("%s: %s needs a value" % (where, token))
            value, i = argv[i + 1], i + 2
        else:
            value, i = inline, i + 1
        try:
            spec[key] = {"int": int, "float": float, "str": str, "names": str, "json": json.loads}[kind](value)
        except ValueError as e:
            raise RecipeError("%s: %s %r: %s" % (where, token, value, e))
    return spec


def role_of(entry):
    """The recipe role a host of the plan plays: prefill / decode for PD, else leader / worker."""
    if entry.get("kv_role") == "kv_producer":
        return "prefill"
    if entry.get("kv_role") == "kv_consumer":
        return "decode"
    return entry["role"]


def render(recipe, role, values):
    """-> (spec, env) of one role with the plan's values bound: exactly the recipe."""
    where = "recipe %s, role %s" % (recipe["name"], role)
    roles = recipe.get("roles") or {}
    if role not in roles:
        raise RecipeError("%s: the recipe has no such role (it has %s)" % (where, ", ".join(sorted(roles))))
    bound = dict((var, values.get(field)) for var, field in (recipe.get("variables") or {}).items())
    # what the source computes from its variables (a JSON built with printf): the template as published, bound; a
    # variable without a value stays as the source wrote it (a deviation row removes what needs it). The source
    # writes it in double quotes ("$SPECULATIVE_CONFIG"), where the shell keeps its quotes: escaped for that
    for var, template in (recipe.get("computed") or {}).items():
        bound[var] = re.sub(r'([\\"])', r"\\\1", bind(template, bound, where, strict=False))
    spec = command_spec(bind(roles[role]["command"], bound, where), where)
    env = {}
    for layer in (recipe.get("env"), roles[role].get("env")):
        env.update((k, bind(v, bound, where, strict=False)) for k, v in (layer or {}).items())
    return spec, env


def applies(row, recipe, role, entry, values=None):
    when = row.get("when") or {}
    values = values or {}
    if when.get("lines") and str(values.get("line")) not in [str(x) for x in when["lines"]]:
        return False
    if "draft" in when and bool(values.get("draft_dir")) != bool(when["draft"]):
        return False
    if "fabric_mem" in when and bool(values.get("fabric_mem", True)) != bool(when["fabric_mem"]):
        return False
    if when.get("recipes") and recipe["name"] not in when["recipes"]:
        return False
    if when.get("roles") and role not in when["roles"]:
        return False
    if when.get("launch") and entry.get("launch") not in when["launch"]:
        return False
    if "serves_http" in when and bool(entry.get("serves_http")) != bool(when["serves_http"]):
        return False
    if "kv_pool" in when and bool(entry.get("kv_pool")) != bool(when["kv_pool"]):
        return False
    if "service_alias" in when and bool(entry.get("service_alias")) != bool(when["service_alias"]):
        return False
    return True


def apply_deviations(recipe, role, entry, values, spec, env, rows=None, late=False):
    """The deviation rows that apply, applied to (spec, env) in place. A row sets a flag
    (``flag``) or an environment key (``env``) to ``value`` ({plan value} placeholders) or removes it (``remove``);
    ``if_absent`` rows only add what the recipe does not set itself; ``merge`` rows add keys to a JSON flag. -> the rows
    that changed something. ``after_overrides`` rows act on what the operator's overrides left: they run with
    ``late`` true, the others with it false."""
    applied = []
    for row in rows if rows is not None else deviations():
        if "container" in row or bool(row.get("after_overrides")) != late or \
                not applies(row, recipe, role, entry, values):
            continue
        target, key = (spec, row["flag"]) if "flag" in row else (env, row["env"])
        if row.get("if_absent") and key in target:
            continue
        if row.get("remove"):
            if key not in target:
                continue
            target.pop(key)
        elif "merge" in row:
            if not isinstance(target.get(key), dict):
                continue
            merged = deep_merge(target[key], fill(row["merge"], values))
            if merged == target[key]:
                continue
            target[key] = merged
        else:
            value = fill(row["value"], values)
            if "flag" in row and key in vllm_cli.FLAGS and vllm_cli.FLAGS[key][1] == "int":
                value = int(value)
            if target.get(key) == value:
                continue
            target[key] = value if "flag" in row else str(value)
        applied.append(row)
    return applied


def deep_merge(base, extra):
    """``base`` with ``extra``'s keys, dicts merged key by key and lists item by item (a nested JSON flag keeps what a
    row does not name; ``{}`` in a list leaves that item as it is)."""
    if isinstance(base, dict) and isinstance(extra, dict):
        out = dict(base)
        for k, v in extra.items():
            out[k] = deep_merge(out[k], v) if k in out else v
        return out
    if isinstance(base, list) and isinstance(extra, list):
        return [deep_merge(b, e) for b, e in zip(base, extra)] + base[len(extra):]
    return extra


NUMBER_PLACEHOLDER = re.compile(r"^\{(\w+):d\}$")


def fill(value, values):
    """A row's value with its {plan value} placeholders filled, inside dicts and lists too; a value that is one
    ``{name:d}`` placeholder is that plan value as a number (a JSON number where the source writes one)."""
    if isinstance(value, str):
        number = NUMBER_PLACEHOLDER.match(value)
        if number:
            return int(values[number.group(1)])
        return value.format(**values)
    if isinstance(value, dict):
        return dict((k, fill(v, values)) for k, v in value.items())
    if isinstance(value, list):
        return [fill(v, values) for v in value]
    return value


def _show(key, value):
    if value is None:
        return "(absent)"
    flag, kind = vllm_cli.FLAGS.get(key, (key, "str"))
    if kind == "json":
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def compare(recipe_spec, recipe_env, spec, env, reasons):
    """Every difference between the recipe (bound) and what the host runs: [{kind: flag|env, key, recipe, runs, why}],
    ``why`` from ``reasons`` ({('flag'|'env', key): why}) or None when nothing explains it."""
    out = []
    for kind, a, b in (("flag", recipe_spec, spec), ("env", recipe_env, env)):
        for key in sorted(set(a) | set(b)):
            if a.get(key) == b.get(key):
                continue
            name = vllm_cli.FLAGS[key][0] if kind == "flag" and key in vllm_cli.FLAGS else key
            out.append({"kind": kind, "key": name, "recipe": _show(key, a.get(key)) if kind == "flag"
                        else (a.get(key) if key in a else "(absent)"),
                        "runs": _show(key, b.get(key)) if kind == "flag" else (b.get(key) if key in b else "(absent)"),
                        "why": reasons.get((kind, key))})
    return out


def container_diff(recipe, runs, model_dirs, rows=None):
    """What differs between the recipe's container (its source's docker run: shm size, privileged, read-only mounts
    besides the model) and the one the host runs (``runs``: shm_size, privileged, mounts as src:dst:mode), each with
    the reason of the deviation row of that container setting, or None. A recipe without a container publishes none."""
    published = recipe.get("container") or {}
    why = dict((r["container"], "deviation " + r["id"]) for r in (rows if rows is not None else deviations())
               if "container" in r)
    out = []
    if "shm_size" in published and str(published["shm_size"]) != str(runs.get("shm_size")):
        out.append({"kind": "container", "key": "--shm-size", "recipe": str(published["shm_size"]),
                    "runs": str(runs.get("shm_size")), "why": why.get("shm_size")})
    if "privileged" in published and bool(published["privileged"]) != bool(runs.get("privileged")):
        out.append({"kind": "container", "key": "--privileged", "recipe": str(bool(published["privileged"])).lower(),
                    "runs": str(bool(runs.get("privileged"))).lower(), "why": why.get("privileged")})
    if "mounts" in published:
        want = set(m.rstrip("/") for m in published["mounts"]) | set(model_dirs)
        have = set(m.split(":", 1)[0].rstrip("/") for m in runs.get("mounts") or [])
        for path in sorted(want | have):
            if (path in want) != (path in have):
                out.append({"kind": "container", "key": "mount " + path,
                            "recipe": path if path in want else "(absent)", "runs": path if path in have else "(absent)",
                            "why": why.get("mounts")})
    return out
