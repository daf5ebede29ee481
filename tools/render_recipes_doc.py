"""Write docs/recipes.md from the recipes (data/recipes) and the deviations table (data/deviations.yml).

  python tools/render_recipes_doc.py            # rewrite docs/recipes.md
  python tools/render_recipes_doc.py --check    # exit 1 when docs/recipes.md is not what the data says

The unit stage runs --check, so the document never drifts from the data.
"""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "collections"))

from ansible_collections.npuops.ascend.plugins.plugin_utils import recipes  # noqa: E402

DOC = os.path.join(REPO, "docs", "recipes.md")
# the plan values a recipe's variables and a deviation row's {placeholders} may name (plugin_utils/model/serve.py plan_values)
PLAN_VALUES = [
    ("model_dir", "npuops_model_dir"),
    ("tokenizer_dir", "npuops_tokenizer_dir, or the model directory"),
    ("served_model_name", "the served_model_name of the instance's model preset (with its npuops_model_overrides)"),
    ("service_model_name", "the service's name behind a gateway that mixes the instances: the first instance's "
                           "served_model_name"),
    ("node_ip", "the host's npuops_node_ip"),
    ("leader_address", "npuops_node_ip of its engine group's leader"),
    ("nic", "the host's npuops_nic"),
    ("api_port", "the API port (npuops_api_port, else the recipe's or the tier's)"),
    ("dp_rpc_port", "the DP RPC port (npuops_dp_rpc_port, else the recipe's or the tier's)"),
    ("master_port", "the multi-node rendezvous port (npuops_master_port, else the tier's)"),
    ("tp, pp, dp, dp_local", "the engine group's parallel sizes (the tier)"),
    ("dp_start_rank, node_rank, nodes", "the host's ranks in its group, and the group's size"),
    ("kv_port", "the group's KV port (npuops_<group>_kv_port, else the tier's)"),
    ("engine_id", "a stable id per PD engine: <instance->group-rank"),
    ("visible_devices", "0,1,...,dies-1"),
]


def code(text, lang="sh"):
    return "```%s\n%s\n```" % (lang, text.rstrip("\n"))


def render():
    out = ["# Recipes", "",
           "<!-- Written by tools/render_recipes_doc.py from data/recipes and data/deviations.yml; do not edit. -->",
           "",
           "A recipe is a validated launch configuration exactly as its source publishes it: the `vllm serve` command "
           "and the environment of each role (leader, headless worker, prefill, decode), with the source's own shell "
           "variables. npuops binds each variable to the plan's value the recipe names, then applies the rows of the "
           "deviations table below, then the operator's overrides (`npuops_model_overrides`, `npuops_vllm_overrides`, "
           "`npuops_env_overrides`). Nothing else changes: a unit test renders every recipe and refuses any other "
           "difference.", "",
           "Shell lines a source runs before its command (`setup`, e.g. the A2 page's `source .../set_env.sh` of the "
           "CANN toolkit and of vllm-ascend's custom operators) run in the engine's container: its command is "
           "`/bin/bash -c '<line> && <line> && exec \"$@\"' npuops-recipe-setup vllm serve ...`, so each must "
           "succeed and the command's argv stays as rendered.", "",
           "A source that publishes a configuration as another one with some values changed (the Kimi-K3 page's "
           "1M-context note) is a recipe with `base` (that recipe) and `changes` (flag: value, each replaced in every "
           "role's command; each flag must appear once in the base's command).", "",
           "The inventory chooses one with `npuops_recipe`; without it, the plan takes the recipe of the tier and "
           "model preset that was validated on the vLLM-Ascend line of the image (`npuops_image`; its line is in "
           "`data/images.yml`): an image newer than every such recipe plans with the newest one and says so, an "
           "older one (or one between their lines) is refused naming both. `plan.yml` prints which recipe each "
           "instance follows, its source, the image's line, and what upstream has published in its place since. "
           "`playbooks/plan.yml` prints, per host, every flag and environment key that differs from the recipe and "
           "why, e.g. with `-e '{\"npuops_model_overrides\": {\"max_num_seqs\": 32}}'`:", "",
           code("a3-node-01: recipe kimi_k3_tutorial_4node_a3\n"
                "  --host: 0.0.0.0 -> 192.168.100.11 (deviation listen_on_the_node_address)\n"
                "  --max-num-seqs: 16 -> 32 (npuops_model_overrides.max_num_seqs)\n"
                "  env VLLM_HOST_IP: (absent) -> 192.168.100.11 (deviation vllm_host_ip)", "text"), "",
           "## The recipes", "",
           "| Recipe | Tier | Model presets | vLLM-Ascend lines | Image | Source |", "|---|---|---|---|---|---|"]
    names = recipes.names()
    for name in names:
        r = recipes.load(name)
        out.append("| [`%s`](#%s) | `%s` | %s | %s | `%s` | %s |" % (
            name, name.replace("_", "-").lower(), r["tier"], ", ".join("`%s`" % m for m in r["models"]),
            ", ".join(str(x) for x in r.get("lines") or []) or "not named", r["image"],
            " ".join(r["source"]["title"].split())))
    out += ["", "Recipe ports, where the source gives a value, replace the tier's defaults (the tutorial's "
            "`RPC_PORT=13345`); the inventory's `npuops_<name>_port` still wins.", ""]
    for name in names:
        r = recipes.load(name)
        out += ["### %s" % name, "", r["summary"], "",
                "- Source: %s (%s)" % (" ".join(r["source"]["title"].split()), r["source"]["document"]),
                "- Image: `%s` (vLLM %s); validated on vLLM-Ascend %s" % (
                    r["image"], r.get("vllm") or "not named", ", ".join(str(x) for x in r.get("lines") or []) or
                    "no line named"),
                "- Variables: %s" % (", ".join("`$%s` = %s" % (k, v) for k, v in r["variables"].items()) or "none"),
                "- Ports: %s" % (", ".join("%s %s" % kv for kv in (r.get("ports") or {}).items()) or "the tier's"),
                ""]
        if r.get("superseded"):
            out += ["Superseded upstream: %s (%s). The plan still renders it for the images of its lines, and says "
                    "so." % (r["superseded"]["by"], " ".join(r["superseded"]["source"].split())), ""]
        if r.get("computed"):
            out += ["Computed by the source from its variables (the flag that uses one is quoted, as the source quotes "
                    "it):", "", code("\n".join("%s=%s" % kv for kv in r["computed"].items())), ""]
        if r.get("base"):
            out += ["The source publishes it as recipe [`%s`](#%s) with these values changed in every role's command "
                    "(`base` and `changes`; the commands below are the result):" % (
                        r["base"], r["base"].replace("_", "-").lower()), "",
                    "| Flag | Value |", "|---|---|"] + ["| `%s` | `%s` |" % kv for kv in r["changes"].items()] + [""]
        if r.get("setup"):
            out += ["Run first, in every role's container:", "", code("\n".join(r["setup"])), ""]
        if r.get("env"):
            out += ["Environment of every role:", "", code("\n".join("export %s=%s" % kv for kv in r["env"].items())),
                    ""]
        for role, body in r["roles"].items():
            out += ["Role `%s`:" % role, ""]
            if body.get("env"):
                out += [code("\n".join("export %s=%s" % kv for kv in body["env"].items())), ""]
            out += [code(body["command"]), ""]
    out += ["## Deviations", "",
            "Everything npuops adds to or changes in a recipe (`data/deviations.yml`). `if absent`: only where the "
            "recipe does not set it itself; `after the overrides`: on what the operator's overrides left.", "",
            "| Row | Changes | To | Applies to | Why | Source |", "|---|---|---|---|---|---|"]
    for row in recipes.deviations():
        what = ("flag `%s`" % row["flag"]) if "flag" in row else ("env `%s`" % row["env"]) if "env" in row else \
            ("container `%s`" % row["container"])
        if "container" in row:
            to = "the serve role's value"
        elif row.get("remove"):
            to = "removed"
        elif "merge" in row:
            to = "adds %s" % json.dumps(row["merge"])
        else:
            to = "`%s`" % (json.dumps(row["value"]) if isinstance(row["value"], (dict, list)) else row["value"])
        when = row.get("when") or {}
        where = "; ".join("%s: %s" % (k, ", ".join(map(str, v)) if isinstance(v, list) else v)
                          for k, v in when.items()) or "all"
        if row.get("if_absent"):
            where += " (if absent)"
        if row.get("after_overrides"):
            where += " (after the overrides)"
        out.append("| `%s` | %s | %s | %s | %s | %s |" % (row["id"], what, to, where, " ".join(row["reason"].split()),
                                                         row["source"]))
    out += ["", "## Plan values", "", "What a recipe's `variables` and a deviation row's `{placeholders}` name.", "",
            "| Name | Value |", "|---|---|"]
    out += ["| `%s` | %s |" % kv for kv in PLAN_VALUES]
    return "\n".join(out) + "\n"


def main(argv):
    text = render()
    if "--check" in argv:
        with open(DOC) as f:
            if f.read() != text:
                print("docs/recipes.md is not what data/recipes and data/deviations.yml say: run "
                      "python tools/render_recipes_doc.py")
                return 1
        return 0
    with open(DOC, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
