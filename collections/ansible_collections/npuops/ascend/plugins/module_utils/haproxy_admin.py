# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HAProxy's admin socket (a unix socket, level admin): one command per connection, `show stat` parsed, servers
set to ready / drain / maint, bounded waits for a drained server to go idle or a returned one to be UP.

HAProxy 2.6 management guide, section 9.3 (Unix Socket commands): ``show stat`` (CSV; ``status`` is UP, DOWN,
DRAIN, MAINT, ``scur`` the current sessions) and ``set server <backend>/<server> state ready|drain|maint``.
Stdlib only (runs on the gateway host, Python >= 3.8)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import socket
import time

from ansible_collections.npuops.ascend.plugins.module_utils import files

STATES = ("ready", "drain", "maint")
ADMIN_SOCKET = "/run/haproxy/admin.sock"


class AdminError(Exception):
    pass


def command(path, line, timeout=5.0):
    """Send one command, return the whole answer (HAProxy closes the connection after it)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall((line.strip() + "\n").encode())
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except (OSError, socket.timeout) as e:
        raise AdminError("HAProxy admin socket %s: %s (is HAProxy running?)" % (path, e))
    finally:
        s.close()
    return b"".join(chunks).decode("utf-8", "replace")


def parse_stat(text):
    """`show stat` CSV -> [{field: value}] (the header line starts with '# ')."""
    lines = [x for x in text.splitlines() if x.strip()]
    if not lines or not lines[0].startswith("# "):
        raise AdminError("unexpected answer to show stat: %r" % text[:200])
    header = lines[0][2:].split(",")
    return [dict(zip(header, row.split(","))) for row in lines[1:]]


def find_server(rows, backend, server):
    for r in rows:
        if r.get("pxname") == backend and r.get("svname") == server:
            return {"status": r.get("status", ""), "scur": int(r.get("scur") or 0), "weight": r.get("weight")}
    raise AdminError("HAProxy has no server %s/%s; the servers are %s" % (
        backend, server, ", ".join("%s/%s" % (r["pxname"], r["svname"]) for r in rows
                                   if r.get("svname") not in ("FRONTEND", "BACKEND"))))


def state_of(status):
    """The admin state a `show stat` status stands for."""
    s = status.upper()
    if s.startswith("MAINT"):
        return "maint"
    if s.startswith("DRAIN") or "DRAIN" in s:
        return "drain"
    return "ready"


def server(path, backend, name, timeout=5.0):
    return find_server(parse_stat(command(path, "show stat", timeout)), backend, name)


def set_state(path, backend, name, state, timeout=5.0):
    if state not in STATES:
        raise AdminError("state %r is not one of %s" % (state, ", ".join(STATES)))
    answer = command(path, "set server %s/%s state %s" % (backend, name, state), timeout).strip()
    if answer:
        raise AdminError("set server %s/%s state %s: %s" % (backend, name, state, answer))


def wait(path, backend, name, until, timeout, interval=0.2, clock=time.monotonic, sleep=time.sleep):
    """Poll the server until `until(info)` holds; -> (info, seconds). Raises AdminError after `timeout`."""
    t0 = clock()
    while True:
        info = server(path, backend, name)
        if until(info):
            return info, clock() - t0
        if clock() - t0 >= timeout:
            raise AdminError("%s/%s: still %s with %d session(s) after %ds"
                             % (backend, name, info["status"], info["scur"], timeout))
        sleep(interval)


def servers(path, timeout=5.0):
    """Every server of every backend, as HAProxy sees it now: [{backend, server, status, state, sessions}] (state:
    the admin state, ready / drain / maint)."""
    out = []
    for r in parse_stat(command(path, "show stat", timeout)):
        if r.get("svname") in ("FRONTEND", "BACKEND"):
            continue
        status = r.get("status", "")
        out.append({"backend": r.get("pxname"), "server": r.get("svname"), "status": status,
                    "state": state_of(status), "sessions": int(r.get("scur") or 0)})
    return out


# HAProxy's server-state file (configuration manual: ``server-state-file``, ``load-server-state-from-file``): what a
# reload or a restart starts from, so a drained or maintained server stays out of rotation across it. Without it a
# reload starts every server ready: an instance taken out for its answers would serve again.
STATE_FILE = "/var/lib/npuops/haproxy-server-state"


def server_state_text(path, timeout=5.0):
    """`show servers state` (management guide 9.3): a version line, a header, one line per server."""
    text = command(path, "show servers state", timeout)
    if not text.strip() or not text.lstrip().startswith("1"):
        raise AdminError("unexpected answer to show servers state: %r" % text[:200])
    return text


def filter_server_state(text, keep):
    """The server-state lines of the servers in `keep` ({(backend, server): "address:port"} of the configuration about
    to be loaded) at the same address and port: HAProxy applies a state line's port to the server of that name, so a
    server that moved must start from its configuration instead."""
    out = []
    header = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            header = line[1:].split()
            out.append(line)
            continue
        words = line.split()
        if not header or len(words) < len(header):
            out.append(line)  # the version line
            continue
        row = dict(zip(header, words))
        where = (keep or {}).get((row.get("be_name"), row.get("srv_name")))
        if keep is None or where == "%s:%s" % (row.get("srv_addr"), row.get("srv_port")):
            out.append(line)
    return "\n".join(out) + "\n"


def save_server_state(path, state_file, keep=None, timeout=5.0):
    """Write HAProxy's server state to `state_file` (root only, whole or not at all), only the servers of `keep` when
    given (filter_server_state). -> the number of server lines written."""
    text = server_state_text(path, timeout)
    if keep is not None:
        text = filter_server_state(text, keep)
    files.write_atomic(state_file, text, durable=False)
    return sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#") and len(line.split()) > 1)
