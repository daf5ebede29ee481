# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""stage_gate runs on the controller: the all-or-nothing verdict of one step of a stage, from what each host
registered (see the module's documentation)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.plugins.action import ActionBase

from ansible_collections.npuops.ascend.plugins.plugin_utils import results


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("hosts", "key", "stage", "step", "undone", "done_key"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _spec, args = self.validate_argument_spec(argument_spec=dict(
            hosts=dict(type="list", elements="str", required=True),
            key=dict(type="str", required=True),
            stage=dict(type="str", required=True),
            step=dict(type="str", required=True),
            undone=dict(type="str", required=True),
            done_key=dict(type="str"),
        ))
        verdict = results.gate(task_vars["hostvars"], args["hosts"], args["key"], args["stage"], args["step"],
                               args["undone"], args["done_key"])
        result.update(changed=False, failed_hosts=verdict["hosts"], message=verdict["message"])
        return result
