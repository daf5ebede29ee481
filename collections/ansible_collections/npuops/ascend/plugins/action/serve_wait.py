# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""serve_wait: wait for this host's container (npuops.ascend.vllm_container state=ready) in short slices,
and stop waiting as soon as another host of the same wait failed (plugin_utils/board.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.npuops.ascend.plugins.module_utils.container import ENGINE_OPTION
from ansible_collections.npuops.ascend.plugins.plugin_utils.board import Board, board_dir


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("name", "engine", "url", "timeout", "interval", "peers", "unreachable_after", "slice",
                             "run_id", "hosts", "stale_after"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _spec, args = self.validate_argument_spec(argument_spec=dict(
            name=dict(type="str", required=True),
            engine=ENGINE_OPTION,
            url=dict(type="str"),
            timeout=dict(type="int", default=600),
            interval=dict(type="float", default=2),
            peers=dict(type="list", elements="str", default=[]),
            unreachable_after=dict(type="float", default=15),
            slice=dict(type="int", default=10),
            run_id=dict(type="str", required=True),
            hosts=dict(type="list", elements="str", required=True),
            stale_after=dict(type="int", default=60),
        ))
        me = task_vars["inventory_hostname"]
        if self._task.check_mode:
            result.update(changed=False, msg="check mode: not waiting for %s" % args["name"])
            return result
        board = Board(board_dir(args["run_id"]))
        board.post(me, "waiting")
        start = time.time()
        deadline = start + args["timeout"]
        missed = {}
        while True:
            left = deadline - time.time()
            piece = max(1, int(min(args["slice"], left)))
            wait = dict(timeout=piece, interval=args["interval"], peers=args["peers"],
                        unreachable_after=args["unreachable_after"], missed=missed)
            if args["url"]:
                wait["url"] = args["url"]
            try:
                res = self._execute_module(module_name="npuops.ascend.vllm_container", module_args=dict(
                    name=args["name"], engine=args["engine"], state="ready", wait_ready=wait), task_vars=task_vars)
            except AnsibleConnectionFailure as e:
                board.post(me, "unreachable", str(e)[:300])
                result.update(unreachable=True, msg="%s became unreachable while waiting: %s" % (me, e))
                return result
            if res.get("unreachable"):
                board.post(me, "unreachable", res.get("msg", "")[:300])
                result.update(res)
                return result
            timed_out = res.get("failed") and res.get("timed_out")
            if res.get("failed") and not timed_out:
                board.post(me, "failed", res.get("msg", "")[:500])
                result.update(res)
                return result
            if not res.get("failed") and (args["url"] or time.time() >= deadline - 1):
                board.post(me, "ready")
                result.update(changed=False, ready_after=round(time.time() - start, 1),
                              container_id=res.get("container_id"), started_at=res.get("started_at"))
                return result
            missed = res.get("missed") or {}
            others = board.failures(args["hosts"], me=me, stale_after=args["stale_after"])
            if others:
                board.post(me, "aborted")
                result.update(failed=True, aborted=True, msg="stopped waiting for %s: %s" % (args["name"], "; ".join(
                    "%s %s%s" % (h, state, (": " + msg.splitlines()[0][:200]) if msg else "")
                    for h, state, msg in others)))
                return result
            if time.time() >= deadline:
                board.post(me, "failed", res.get("msg", "")[:500])
                result.update(res)
                return result
            board.post(me, "waiting")
