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


def tier_spec(name, **values):
    """A tier document as the tier role defines it, with its '{{ x | default(n) }}' fields resolved."""
    import re
    spec = load_yaml(REPO, "roles", "tier_" + name, "vars", "main.yml")["npuops_tier_spec"]

    def resolve(v):
        if isinstance(v, dict):
            return dict((k, resolve(x)) for k, x in v.items())
        if isinstance(v, list):
            return [resolve(x) for x in v]
        if isinstance(v, str) and v.startswith("{{"):
            var, default = re.match(r"\{\{ (\w+) \| default\(([^)]*)\) \}\}", v).groups()
            if var in values:
                return values[var]
            return yaml.safe_load(default) if default != "''" else ""
        return v
    return resolve(spec)


def presets():
    return load_yaml(COLLECTION, "roles", "plan", "defaults", "main", "presets.yml")["npuops_model_presets"]


def inventory(n, prefix="node", net="10.0.0."):
    hosts = ["%s%02d" % (prefix, i + 1) for i in range(n)]
    hostvars = dict((h, {"npuops_node_ip": net + str(11 + i), "npuops_nic": "enp189s0f0",
                         "npuops_fabric_ip": "10.9.%d.100" % i}) for i, h in enumerate(hosts))
    return {"all": hosts, "npu_nodes": list(hosts)}, hostvars
