# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""plan_topology and instance_models.

Adapters: the code lives in the inventory model, plugin_utils/model/topology.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils.model.topology import (  # noqa: F401
    instance_models,
    plan_topology)


class FilterModule(object):
    def filters(self):
        return {"plan_topology": plan_topology, "instance_models": instance_models}
