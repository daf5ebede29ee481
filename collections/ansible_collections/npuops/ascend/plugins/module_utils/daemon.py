# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A background process owned through its pid file, for hosts without systemd (and the simulated nodes).

The pid file records the pid, the process's start time (so a recycled pid is never taken for ours) and the
command line; converging compares the wanted command line with the recorded one: the same and alive -> nothing to
do; different -> the old one is ended (SIGTERM, then SIGKILL) and the new one started in its own session, its
output to a log file. A reload (new configuration, same command line) is a SIGHUP to exactly that pid.
Standard library only: this runs on the nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import signal
import subprocess
import time

from ansible_collections.npuops.ascend.plugins.module_utils import proc


def start_time(pid, proc_root="/proc"):
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None when there is no
    such process or it is a zombie (ended, not yet reaped by its parent)."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat")) as f:
            stat = f.read()
    except (OSError, IOError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def read_record(pidfile):
    try:
        with open(pidfile) as f:
            record = json.load(f)
    except (OSError, IOError, ValueError):
        return None
    return record if isinstance(record, dict) and "pid" in record else None


def pid_in_file(pidfile):
    """The pid a pid file names: the first line (HAProxy, keepalived) or the record `start` writes (managed_process,
    Prometheus). None when there is no such file or no pid in it."""
    record = read_record(pidfile)
    if record is not None:
        pid = record["pid"]
    else:
        try:
            with open(pidfile) as f:
                pid = f.readline().strip()
        except (OSError, IOError):
            return None
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return None
    return pid if pid > 0 else None


def pid_file_running(pidfile, proc_root="/proc"):
    """The pid of `pidfile` when that process runs (not a zombie), else None."""
    pid = pid_in_file(pidfile)
    return pid if pid is not None and start_time(pid, proc_root) is not None else None


def alive(record, proc_root="/proc"):
    return bool(record) and start_time(record["pid"], proc_root) == record.get("start_time")


def status(pidfile, proc_root="/proc"):
    """-> the record when its process runs, else None."""
    record = read_record(pidfile)
    return record if alive(record, proc_root) else None


def stop(record, grace=5.0):
    """End the recorded process (its session: what it started goes with it)."""
    if not alive(record):
        return False
    proc.end([record["pid"]], grace, alive=lambda _pid: alive(record), group=True)
    return True


def start(argv, pidfile, log, env=None, cwd="/"):
    """Start argv in its own session, output to `log`; record it in `pidfile`. -> the record."""
    for path in (pidfile, log):
        d = os.path.dirname(path)
        if d and not os.path.isdir(d):
            os.makedirs(d, 0o755)
    logf = open(log, "ab")
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, close_fds=True,
                             cwd=cwd, env=env, start_new_session=True)
    finally:
        logf.close()
    st = None
    for _i in range(50):
        st = start_time(p.pid)
        if st is not None:
            break
        time.sleep(0.02)
    record = {"pid": p.pid, "start_time": st, "argv": list(argv)}
    tmp = pidfile + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.rename(tmp, pidfile)
    return record


def converge(argv, pidfile, log, state="started", reload_token=None, env=None, check_mode=False):
    """-> {changed, action, record}. action: none, started, restarted, reloaded, stopped.

    `reload_token` (e.g. the hash of a configuration file): when it differs from the recorded one and the command
    line is the same, the process gets SIGHUP instead of a restart."""
    record = status(pidfile)
    if state == "stopped":
        if record is None:
            return {"changed": False, "action": "none", "record": None}
        if not check_mode:
            stop(record)
            try:
                os.unlink(pidfile)
            except OSError:
                pass
        return {"changed": True, "action": "stopped", "record": record}
    if record is not None and record.get("argv") == list(argv):
        if reload_token is None or record.get("reload_token") == reload_token:
            return {"changed": False, "action": "none", "record": record}
        if not check_mode:
            os.kill(record["pid"], signal.SIGHUP)
            record["reload_token"] = reload_token
            _write(pidfile, record)
        return {"changed": True, "action": "reloaded", "record": record}
    action = "restarted" if record is not None else "started"
    if check_mode:
        return {"changed": True, "action": action, "record": record}
    if record is not None:
        stop(record)
    record = start(argv, pidfile, log, env=env)
    if reload_token is not None:
        record["reload_token"] = reload_token
        _write(pidfile, record)
    return {"changed": True, "action": action, "record": record}


def _write(pidfile, record):
    tmp = pidfile + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.rename(tmp, pidfile)


def http_status(url, timeout):
    """The HTTP status of a GET of url, or None when nothing answered (http.client: this also runs outside
    Ansible, in the exporter daemon)."""
    try:
        from http.client import HTTPConnection, HTTPSConnection
        from urllib.parse import urlsplit
    except ImportError:  # pragma: no cover
        return None
    parts = urlsplit(url)
    conn_class = HTTPSConnection if parts.scheme == "https" else HTTPConnection
    conn = conn_class(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("GET", (parts.path or "/") + ("?" + parts.query if parts.query else ""))
        return conn.getresponse().status
    except Exception:  # pylint: disable=broad-except
        return None
    finally:
        conn.close()


def wait_http(url, timeout, interval=0.3, status_of=None):
    """Poll url until it answers 2xx; -> (ok, last error)."""
    status_of = status_of or http_status
    deadline = time.time() + timeout
    last = None
    while True:
        status = status_of(url, 3)
        if status is not None and 200 <= status < 300:
            return True, None
        last = "HTTP %s" % status if status is not None else "no answer"
        if time.time() >= deadline:
            return False, last
        time.sleep(interval)


def log_tail(log, lines=20):
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 8192))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except (OSError, IOError):
        return ""
