#!/usr/bin/env python3
"""A platform driving an npuops rollout through ansible-runner (see docs/ansible-runner.md).

    examples/runner_rollout.py -i inventories/a3-4node [--skip-tags bench] [-e '{"npuops_bench_matrix": "sim"}']

Runs playbooks/site.yml with run_async, streams one line per task result and host, reports status
changes, cancels cleanly on Ctrl-C or SIGTERM (and after --timeout seconds), then prints the outcome the
playbook hands over with set_stats - the endpoint, the model, every stage's result - as JSON on stdout.
Exit code: 0 when the rollout succeeded, 1 when it failed, 2 when it was canceled or timed out.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

import ansible_runner

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TASK_EVENTS = {"runner_on_ok": "ok", "runner_on_failed": "FAILED", "runner_on_unreachable": "UNREACHABLE",
               "runner_on_skipped": None}


def outcome(runner):
    """What site.yml's set_stats handed over (key npuops), from the playbook_on_stats event."""
    for event in runner.events:
        if event.get("event") == "playbook_on_stats":
            return (event.get("event_data", {}).get("artifact_data") or {}).get("npuops")
    return None


def rollout(inventory, extravars=None, tags=None, skip_tags=None, private_data_dir=None, timeout=None,
            log=print, cancel=None):
    """Start site.yml and wait for it. -> (runner, outcome). `cancel` is a threading.Event a caller may set."""
    cancel = cancel or threading.Event()
    deadline = time.time() + timeout if timeout else None

    def event_handler(event):
        kind = TASK_EVENTS.get(event.get("event"), "")
        if kind:
            data = event["event_data"]
            line = "%-8s %-12s %s" % (kind, data.get("host"), data.get("task"))
            if kind != "ok":
                line += ": %s" % str(data.get("res", {}).get("msg", ""))[:300]
            log(line)
        return True  # keep every event in the artifacts

    def status_handler(status, runner_config=None):
        log("status   %s" % status["status"])

    def cancel_callback():
        if deadline and time.time() > deadline:
            cancel.set()
        return cancel.is_set()

    private_data_dir = private_data_dir or os.path.join(REPO, "artifacts", "runner")
    os.makedirs(private_data_dir, exist_ok=True)
    envvars = {"ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
               "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    thread, runner = ansible_runner.run_async(
        private_data_dir=private_data_dir, project_dir=REPO, playbook="playbooks/site.yml",
        inventory=os.path.abspath(inventory), extravars=extravars or {}, tags=tags, skip_tags=skip_tags,
        envvars=envvars, quiet=True, event_handler=event_handler, status_handler=status_handler,
        cancel_callback=cancel_callback)
    thread.join()
    return runner, outcome(runner)


def extravars_of(text):
    """-e's value: a JSON object, or @FILE holding one (JSON or YAML), as ansible-playbook's -e takes it."""
    if text.startswith("@"):
        import yaml
        with open(text[1:]) as f:
            return yaml.safe_load(f) or {}
    return json.loads(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-i", "--inventory", required=True)
    ap.add_argument("-e", "--extravars", default="{}",
                    help="extra variables as a JSON object, or @FILE (JSON or YAML; keep secrets there, in a "
                         "root-only file: a command line is visible in ps)")
    ap.add_argument("--tags")
    ap.add_argument("--skip-tags")
    ap.add_argument("--private-data-dir")
    ap.add_argument("--timeout", type=float, help="cancel the rollout after this many seconds")
    args = ap.parse_args()
    cancel = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: cancel.set())
    runner, result = rollout(args.inventory, extravars_of(args.extravars), args.tags, args.skip_tags,
                             args.private_data_dir, args.timeout, log=lambda s: print(s, file=sys.stderr),
                             cancel=cancel)
    print(json.dumps({"status": runner.status, "rc": runner.rc, "stats": runner.stats, "npuops": result},
                     indent=2, sort_keys=True))
    if runner.status == "canceled" or runner.status == "timeout":
        return 2
    return 0 if runner.status == "successful" else 1


if __name__ == "__main__":
    sys.exit(main())
