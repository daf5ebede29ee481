# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import socket
import tempfile
import threading

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import haproxy_admin as ha

STAT = ("# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,"
        "weight\n"
        "npuops,FRONTEND,,,1,2,,9,0,0,0,0,0,,,,,OPEN,\n"
        "be_service,a-1,0,0,{a_cur},1,,5,0,0,,0,,0,0,0,0,{a_status},1\n"
        "be_service,b-1,0,0,0,1,,4,0,0,,0,,0,0,0,0,UP,1\n"
        "be_service,BACKEND,0,0,0,1,,9,0,0,0,0,,0,0,0,0,UP,2\n\n")


class FakeHaproxy:
    """A unix socket answering like HAProxy's admin socket: one command per connection."""

    def __init__(self):
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "admin.sock")
        self.state = {"a_status": "UP", "a_cur": 2}
        self.commands = []
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(self.path)
        self.sock.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn = self.sock.accept()[0]
            except OSError:
                return
            line = conn.makefile().readline().strip()
            self.commands.append(line)
            if line == "show stat":
                answer = STAT.format(**self.state)
                # in-flight sessions finish one poll at a time
                self.state["a_cur"] = max(0, self.state["a_cur"] - 1)
            elif line == "set server be_service/a-1 state drain":
                self.state["a_status"], answer = "DRAIN", "\n"
            elif line.startswith("set server be_service/nope"):
                answer = "No such server.\n"
            else:
                answer = "\n"
            conn.sendall(answer.encode())
            conn.close()

    def close(self):
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


@pytest.fixture(name="fake")
def fake_fixture():
    f = FakeHaproxy()
    yield f
    f.close()


def test_parse_show_stat_and_find_a_server(fake):
    assert ha.server(fake.path, "be_service", "b-1") == {"status": "UP", "scur": 0, "weight": "1"}
    with pytest.raises(ha.AdminError, match=r"HAProxy has no server be_service/c-1; the servers are "
                                            r"be_service/a-1, be_service/b-1"):
        ha.server(fake.path, "be_service", "c-1")


def test_drain_then_wait_until_idle(fake):
    ha.set_state(fake.path, "be_service", "a-1", "drain")
    info, _took = ha.wait(fake.path, "be_service", "a-1", lambda i: i["scur"] == 0, timeout=5, interval=0.01)
    assert info == {"status": "DRAIN", "scur": 0, "weight": "1"}
    assert fake.commands[0] == "set server be_service/a-1 state drain"
    assert ha.state_of("DRAIN") == "drain" and ha.state_of("MAINT") == "maint" and ha.state_of("UP 1/3") == "ready"


def test_an_error_answer_and_a_bounded_wait_fail_naming_the_server(fake):
    with pytest.raises(ha.AdminError, match="set server be_service/nope state ready: No such server."):
        ha.set_state(fake.path, "be_service", "nope", "ready")
    fake.state["a_cur"] = 10 ** 6
    ticks = iter(range(100))
    with pytest.raises(ha.AdminError, match=r"be_service/a-1: still UP with \d+ session\(s\) after 3s"):
        ha.wait(fake.path, "be_service", "a-1", lambda i: i["scur"] == 0, timeout=3, clock=lambda: next(ticks),
                sleep=lambda _s: None)


def test_no_socket_is_an_admin_error():
    with pytest.raises(ha.AdminError, match=r"HAProxy admin socket /nonexistent/admin.sock: .*is HAProxy running"):
        ha.command("/nonexistent/admin.sock", "show stat")


def test_every_server_with_its_admin_state(fake):
    fake.state.update(a_status="DRAIN", a_cur=0)
    assert ha.servers(fake.path) == [
        {"backend": "be_service", "server": "a-1", "status": "DRAIN", "state": "drain", "sessions": 0},
        {"backend": "be_service", "server": "b-1", "status": "UP", "state": "ready", "sessions": 0}]


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _real_haproxy_config(d, port_a, front):
    return "\n".join([
        "global", "    master-worker", "    stats socket %s/admin.sock mode 600 level admin" % d,
        "    server-state-file %s/state" % d, "defaults", "    mode http", "    load-server-state-from-file global",
        "    timeout connect 1s", "    timeout client 5s", "    timeout server 5s",
        "frontend f", "    bind 127.0.0.1:%d" % front, "    default_backend be_service", "backend be_service",
        "    server a-1 127.0.0.1:%d" % port_a, "    server b-1 127.0.0.1:18702", ""])


def test_a_drained_server_stays_out_across_a_reload_of_the_real_haproxy_and_a_moved_one_starts_ready():
    """HAProxy 2.6 starts every server ready after a reload unless its server-state file says otherwise: the state
    written before the reload keeps a drained server drained; a server whose port changed in the new configuration
    starts from the configuration (HAProxy would apply the old port of its state line)."""
    import shutil
    import signal
    import subprocess
    import time
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert os.path.exists(binary), "haproxy is installed by tools/setup.sh"
    d = tempfile.mkdtemp(prefix="hap", dir="/tmp")  # a unix socket's path has at most 107 bytes
    cfg = os.path.join(d, "haproxy.cfg")
    front = _free_port()
    with open(cfg, "w") as f:
        f.write(_real_haproxy_config(d, 18701, front))
    sock = os.path.join(d, "admin.sock")
    master = subprocess.Popen([binary, "-W", "-f", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def states():
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    return dict((s["server"], s["state"]) for s in ha.servers(sock))
                except ha.AdminError:
                    time.sleep(0.1)
            raise AssertionError("haproxy did not answer")

        def reload():
            before = states()
            master.send_signal(signal.SIGUSR2)
            time.sleep(1.0)  # the new worker takes over the socket
            return before

        assert states() == {"a-1": "ready", "b-1": "ready"}
        ha.set_state(sock, "be_service", "a-1", "drain")
        ha.set_state(sock, "be_service", "b-1", "maint")
        keep = {("be_service", "a-1"): "127.0.0.1:18701", ("be_service", "b-1"): "127.0.0.1:18702"}
        assert ha.save_server_state(sock, os.path.join(d, "state"), keep) == 2
        assert oct(os.stat(os.path.join(d, "state")).st_mode & 0o777) == "0o600"
        reload()
        assert states() == {"a-1": "drain", "b-1": "maint"}
        # without the file the reload would have put both back (what the rotation must never let happen)
        os.unlink(os.path.join(d, "state"))
        reload()
        assert states() == {"a-1": "ready", "b-1": "ready"}
        # a-1 moves to another port: its old line is dropped, b-1's kept
        ha.set_state(sock, "be_service", "a-1", "drain")
        ha.set_state(sock, "be_service", "b-1", "drain")
        with open(cfg, "w") as f:
            f.write(_real_haproxy_config(d, 18711, front))
        moved = dict(keep)
        moved[("be_service", "a-1")] = "127.0.0.1:18711"
        assert ha.save_server_state(sock, os.path.join(d, "state"), moved) == 1
        reload()
        assert states() == {"a-1": "ready", "b-1": "drain"}
        addresses = ha.command(sock, "show servers state")
        assert " a-1 127.0.0.1 " in addresses and " 18711 " in addresses
    finally:
        master.terminate()
        master.wait(10)
        shutil.rmtree(d, ignore_errors=True)
