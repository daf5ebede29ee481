# bench/rerun's profile: the controller's CPU seconds per task (the playbook process and the workers it has reaped,
# with their ssh clients; ssh control masters detach and are left out), summed by task name over the run and written
# as JSON to NPUOPS_BENCH_TASK_CPU, so a re-run's controller cost can be put on the tasks that spend it.
import json
import os
import resource
import time

from ansible.plugins.callback import CallbackBase


def cpu_now():
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_cpu"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.tasks = {}
        self.current = None
        self.started = (cpu_now(), time.monotonic())

    def _close(self):
        if self.current is not None:
            cpu, wall = cpu_now(), time.monotonic()
            entry = self.tasks.setdefault(self.current, {"cpu": 0.0, "wall": 0.0, "runs": 0})
            entry["cpu"] += cpu - self.started[0]
            entry["wall"] += wall - self.started[1]
            entry["runs"] += 1
        self.started = (cpu_now(), time.monotonic())

    def _open(self, name):
        self._close()
        self.current = name

    def v2_playbook_on_play_start(self, play):
        self._open("(play start) " + play.get_name())

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._open("%s | %s" % (task._role.get_name() if task._role else "-", task.get_name()))

    def v2_playbook_on_handler_task_start(self, task):
        self._open("(handler) " + task.get_name())

    def v2_playbook_on_stats(self, stats):
        self._open("(stats)")
        self._close()
        with open(os.environ["NPUOPS_BENCH_TASK_CPU"], "w") as out:
            json.dump(self.tasks, out, indent=1, sort_keys=True)
