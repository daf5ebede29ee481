# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""validate_inventory, inventory_model and the other plan-stage filters over the inventory.

Adapters: the code lives in the inventory model, plugin_utils/model/inventory.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils.model.inventory import (  # noqa: F401
    instance_specs,
    inventory_model,
    model_spec,
    tier_document,
    validate_inventory)


class FilterModule(object):
    def filters(self):
        return {"validate_inventory": validate_inventory, "tier_document": tier_document, "model_spec": model_spec,
                "instance_specs": instance_specs, "inventory_model": inventory_model}
