# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import yaml

HERE = os.path.dirname(__file__)
COLLECTION = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
REPO = os.path.abspath(os.path.join(COLLECTION, "..", "..", "..", ".."))


def load_yaml(*parts):
    with open(os.path.join(*parts)) as f:
        return yaml.safe_load(f)


def tier_spec(name):
    """A tier document of the collection (data/tiers), as the validator and the planner read it."""
    return load_yaml(COLLECTION, "data", "tiers", name + ".yml")


def presets():
    return load_yaml(COLLECTION, "roles", "defaults", "defaults", "main", "presets.yml")["npuops_model_presets"]


def inventory(n, prefix="node", net="10.0.0."):
    hosts = ["%s%02d" % (prefix, i + 1) for i in range(n)]
    hostvars = dict((h, {"npuops_node_ip": net + str(11 + i), "npuops_nic": "enp189s0f0",
                         "npuops_fabric_ip": "10.9.%d.100" % i}) for i, h in enumerate(hosts))
    return {"all": hosts, "npu_nodes": list(hosts)}, hostvars


OPTS = {"model_dir": "/data/models/k3", "image": "quay.io/ascend/vllm-ascend:v0.23.0-a3"}


def rendered(tier_name, preset, recipe_name=None, overrides=None, opts=None):
    """What the plan role does before serve_containers: the recipe (the default of tier + preset), the tier with its
    ports, the preset with the recipe's values and the overrides, and the options -> (tier, model, options)."""
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model import inventory as inventory_filter
    from ansible_collections.npuops.ascend.plugins.plugin_utils import recipes
    recipe = recipes.choose(recipe_name, tier_name, preset)
    tier = recipes.tier_with_recipe(tier_spec(tier_name), recipe)
    model = inventory_filter.model_spec(presets(), preset, overrides, recipe)
    return tier, model, dict(opts or OPTS, recipe=recipe, model_overrides=overrides or {})
