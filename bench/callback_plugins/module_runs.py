# bench/rerun's counter: how many modules each host ran itself (delegated runs and skipped tasks left out), so the
# floor it measures next to the re-run runs as many module processes per host as the re-run did.
import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_runs"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.runs = {}

    def _count(self, result):
        # a module's result carries its invocation; set_fact, debug, assert, raw and includes carry none
        if "invocation" in result._result and not result._result.get("_ansible_delegated_vars"):
            host = result._host.get_name()
            self.runs[host] = self.runs.get(host, 0) + 1

    def v2_runner_on_ok(self, result):
        self._count(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count(result)

    def v2_playbook_on_stats(self, stats):
        with open(os.environ["NPUOPS_BENCH_MODULE_RUNS"], "w") as out:
            json.dump(self.runs, out)
