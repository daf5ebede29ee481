# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's data documents: YAML files under ``<collection>/data`` (tiers, image versions).

One source of truth: the inventory validator, the planner, the simulator and the tests all read these files,
from this repository or from an installed collection alike (the path is relative to this file).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import yaml

DATA_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data"))


def load(name):
    """The document ``data/<name>.yml`` (``name`` may contain a sub-directory, e.g. ``tiers/4node_dp``)."""
    with open(os.path.join(DATA_DIR, name + ".yml")) as f:
        return yaml.safe_load(f)


def tiers():
    """{tier name: tier document} of every ``data/tiers/*.yml``."""
    out = {}
    for entry in sorted(os.listdir(os.path.join(DATA_DIR, "tiers"))):
        if entry.endswith(".yml"):
            doc = load("tiers/" + entry[:-4])
            out[doc["name"]] = doc
    return out
