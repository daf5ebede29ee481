# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""inventory_model: the inventory validated, each instance's recipe and spec, and the plan, in one pass.

Adapters: the code lives in the inventory model, plugin_utils/model/inventory.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils.model.inventory import inventory_model


class FilterModule(object):
    def filters(self):
        return {"inventory_model": inventory_model}
