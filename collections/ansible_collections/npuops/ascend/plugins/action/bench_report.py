# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench_report runs on the controller: the report is for people and tools next to ansible-playbook."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible.plugins.action import ActionBase

from ansible_collections.npuops.ascend.plugins.plugin_utils import report


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("results", "report_dir", "meta", "allow_failed_requests", "compare_with"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _spec, args = self.validate_argument_spec(argument_spec=dict(
            results=dict(type="list", elements="dict"),
            report_dir=dict(type="path", required=True),
            meta=dict(type="dict", default={}),
            allow_failed_requests=dict(type="bool", default=False),
            compare_with=dict(type="path"),
        ))
        report_dir = args["report_dir"]
        try:
            if args["results"] is not None:
                if self._task.check_mode:
                    result.update(changed=False, skipped=True, msg="check mode: no report is written")
                    return result
                summary = report.write(report_dir, args["results"], args["meta"])
                result["changed"] = True
            else:
                summary = report.render(report_dir)
            if args["compare_with"]:
                summary["comparison"] = report.compare(report_dir, args["compare_with"])
        except report.ReportError as e:
            result.update(failed=True, msg="bench report %s: %s" % (report_dir, e))
            return result
        result.update(summary)
        result["report_dir"] = os.path.abspath(report_dir)
        bad = [r for r in summary["reconciliation"] if r["problems"]]
        if bad:
            result.update(failed=True, msg="the benchmark does not add up (%s): %s" % (
                summary["report"], "; ".join("%s: %s" % (r["point"], ", ".join(r["problems"])) for r in bad)))
        elif summary["failed_requests"] and not args["allow_failed_requests"]:
            result.update(failed=True, msg="%d benchmark requests failed (see %s)" % (
                summary["failed_requests"], summary["report"]))
        return result
