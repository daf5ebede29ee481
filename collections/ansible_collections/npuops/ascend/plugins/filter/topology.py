# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""instance_models: what each instance of the plan serves.

Adapters: the code lives in the inventory model, plugin_utils/model/topology.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils.model.topology import instance_models


class FilterModule(object):
    def filters(self):
        return {"instance_models": instance_models}
