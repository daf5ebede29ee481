# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""serve_containers and the other deploy-stage filters.

Adapters: the code lives in the inventory model, plugin_utils/model/serve.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils.model.serve import (
    board_dirs,
    deployment_record,
    kv_pool_problems,
    plan_report,
    recipe_choice_lines,
    recipe_diff_lines,
    restore_source,
    serve_containers,
    serve_leftovers,
    serve_previous,
    serve_restarts)


class FilterModule(object):
    def filters(self):
        return {"serve_containers": serve_containers, "serve_previous": serve_previous,
                "serve_restore_source": restore_source, "serve_restarts": serve_restarts, "plan_report": plan_report,
                "kv_pool_problems": kv_pool_problems,
                "board_dirs": board_dirs, "serve_leftovers": serve_leftovers, "recipe_diff_lines": recipe_diff_lines,
                "serve_deployment_record": deployment_record, "recipe_choice_lines": recipe_choice_lines}
