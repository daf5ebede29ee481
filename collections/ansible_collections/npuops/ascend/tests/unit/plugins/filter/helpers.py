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
    return load_yaml(COLLECTION, "roles", "plan", "defaults", "main", "presets.yml")["npuops_model_presets"]


def inventory(n, prefix="node", net="10.0.0."):
    hosts = ["%s%02d" % (prefix, i + 1) for i in range(n)]
    hostvars = dict((h, {"npuops_node_ip": net + str(11 + i), "npuops_nic": "enp189s0f0",
                         "npuops_fabric_ip": "10.9.%d.100" % i}) for i, h in enumerate(hosts))
    return {"all": hosts, "npu_nodes": list(hosts)}, hostvars
