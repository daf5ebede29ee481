# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""weight_wait runs on the controller: one watcher per host, side by side, sharing their state in a directory
of the controller, so that one host failing ends the copy on all of them (see the module's documentation)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.npuops.ascend.plugins.plugin_utils import weights_watch
from ansible_collections.npuops.ascend.plugins.plugin_utils.board import Board, board_dir

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("job", "dest", "run_id", "hosts", "receivers", "interval", "timeout", "lost_after"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _spec, args = self.validate_argument_spec(argument_spec=dict(
            job=dict(type="str"),
            dest=dict(type="path", required=True),
            run_id=dict(type="str", required=True),
            hosts=dict(type="list", elements="str", required=True),
            receivers=dict(type="list", elements="str", required=True),
            interval=dict(type="int", default=20),
            timeout=dict(type="int", default=14400),
            lost_after=dict(type="int", default=90),
        ))
        me = task_vars["inventory_hostname"]
        board = Board(board_dir("weights-%s" % args["run_id"]))
        watch = weights_watch.Watch(me, args, board, self._look, self._stop, display.display)
        try:
            result.update(watch.run(task_vars))
        except AnsibleConnectionFailure as e:
            board.post(me, "unreachable", str(e))
            raise
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _look(self, args, task_vars):
        """One look at the node: -> (job status or None, progress dict or None)."""
        if not args["job"]:
            self._execute_module(module_name="ansible.legacy.ping", module_args={}, task_vars=task_vars)
            return None, None
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        status = self._execute_module(module_name="ansible.legacy.async_status", task_vars=task_vars,
                                      module_args={"jid": args["job"], "_async_dir": async_dir})
        raw = self._execute_module(module_name="ansible.legacy.slurp", task_vars=task_vars,
                                   module_args={"src": os.path.join(args["dest"], ".npuops", "sync-progress.json")})
        progress = None
        if raw.get("content"):
            try:
                progress = json.loads(base64.b64decode(raw["content"]).decode("utf-8"))
            except (ValueError, TypeError):
                progress = None
        return status, progress

    def _stop(self, args, task_vars):
        """End this run's copy job and servers on the node."""
        return self._execute_module(module_name="npuops.ascend.weight_stop", task_vars=task_vars,
                                    module_args={"run_id": args["run_id"]})
