# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The weight servers and copy jobs on a node, by the run that started them.

A run of the weights stage has an id. Its servers carry it in their command line (``--run-id``); its copy
jobs (weight_sync, normally async) record themselves in ``<run_dir>/weight_sync-<pid>.json`` while they run.
So a later run can find what an earlier one left (an interrupted controller, a failed play) and end it
before it starts its own, and a failing run can end exactly its own. Standard library only: runs on nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible_collections.npuops.ascend.plugins.module_utils import proc
from ansible_collections.npuops.ascend.plugins.module_utils.weight_server import SCRIPT_NAME

JOB_PREFIX = "weight_sync-"


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except (IOError, OSError):
        return None


def _start_ticks(pid):
    """The process's start time in clock ticks since boot: with the PID it names one process for good."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (IOError, OSError, ValueError, IndexError):
        return None


def _net_ns(pid="self"):
    try:
        return os.readlink("/proc/%s/ns/net" % pid)
    except (IOError, OSError):
        return None


def servers():
    """[{pid, run_id, root, port}] of the weight servers running on this node (found by their command line,
    whoever started them: also servers of older versions, whose run_id is None).

    Only processes in this process's network namespace count: a server elsewhere (in a container, or another
    node of the simulator, whose nodes share one process table) serves other addresses and is not ours to end.
    """
    found = []
    mine = _net_ns()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = _cmdline(int(entry))
        if not argv or len(argv) < 3 or not argv[1].endswith(SCRIPT_NAME) or argv[2] != "serve":
            continue
        if _net_ns(entry) != mine:
            continue
        opts = dict(zip(argv[3::2], argv[4::2]))
        port = opts.get("--port")
        found.append({"kind": "server", "pid": int(entry), "run_id": opts.get("--run-id"), "root": opts.get("--root"),
                      "port": int(port) if port and port.isdigit() else None})
    return found


def record_job(run_dir, run_id, dest):
    """Note that this process is a copy job of `run_id`; -> the record's path (remove it with forget_job)."""
    if not os.path.isdir(run_dir):
        os.makedirs(run_dir, 0o700)
    pid = os.getpid()
    path = os.path.join(run_dir, "%s%d.json" % (JOB_PREFIX, pid))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": pid, "start_ticks": _start_ticks(pid), "run_id": run_id, "dest": dest,
                   "started": time.time()}, f)
    os.rename(tmp, path)
    return path


def forget_job(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def jobs(run_dir):
    """[{pid, run_id, dest, record}] of the copy jobs recorded under `run_dir` that still run; records of
    jobs that ended (or whose PID now belongs to another process) are removed."""
    found = []
    try:
        names = os.listdir(run_dir)
    except OSError:
        return found
    for name in sorted(names):
        if not (name.startswith(JOB_PREFIX) and name.endswith(".json")):
            continue
        path = os.path.join(run_dir, name)
        try:
            with open(path) as f:
                rec = json.load(f)
            pid = int(rec["pid"])
        except (IOError, OSError, ValueError, KeyError, TypeError):
            forget_job(path)
            continue
        if _start_ticks(pid) is None or _start_ticks(pid) != rec.get("start_ticks"):
            forget_job(path)
            continue
        found.append({"kind": "copy", "pid": pid, "run_id": rec.get("run_id"), "dest": rec.get("dest"),
                      "record": path})
    return found


def select(found, run_id=None, except_run_id=None):
    """The entries of `run_id` (or, with except_run_id, of every other run; with neither, all)."""
    if run_id is not None:
        return [p for p in found if p["run_id"] == run_id]
    if except_run_id is not None:
        return [p for p in found if p["run_id"] != except_run_id]
    return list(found)


def stop(run_dir, run_id=None, except_run_id=None, check_only=False):
    """End the copy jobs and servers of the selected runs (jobs first: they feed nothing). -> what was (or,
    with check_only, would be) stopped."""
    chosen = select(jobs(run_dir), run_id, except_run_id) + select(servers(), run_id, except_run_id)
    if check_only or not chosen:
        return chosen
    proc.end([p["pid"] for p in chosen if p["kind"] == "copy"])
    proc.end([p["pid"] for p in chosen if p["kind"] == "server"])
    for p in chosen:
        if p.get("record"):
            forget_job(p["record"])
        if p["kind"] == "server" and p.get("port") is not None:
            forget_job(os.path.join(run_dir, "weight_serve-%d.json" % p["port"]))
    return chosen
