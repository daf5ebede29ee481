# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import status


def server(wedged=False):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if wedged:
                time.sleep(30)  # the API answers /health, but no token comes out
            body = json.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, "http://127.0.0.1:%d" % srv.server_address[1]


@pytest.fixture
def servers():
    made = [server(), server(wedged=True)]
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there
    yield made[0][1], made[1][1], "http://127.0.0.1:%d" % port
    for srv, _url in made:
        srv.shutdown()


def test_every_probe_runs_at_once_and_a_wedged_engine_gives_no_token(servers):
    good, wedged, dead = servers
    t0 = time.time()
    got = status.probe_all([{"name": "a", "url": good, "model": "m", "engines": [dead]},
                            {"name": "b", "url": wedged, "model": "m", "health_path": "/health"}],
                           token_timeout=2, health_timeout=1)
    assert time.time() - t0 < 5  # one timeout, not the sum of them
    assert got["a"]["front"]["ok"] and got["a"]["front_health"]["ok"]
    assert not got["a"]["engines"][dead]["ok"] and got["a"]["engines"][dead]["status"] is None
    assert got["b"]["front_health"]["ok"] and not got["b"]["front"]["ok"]
    assert got["b"]["front"]["detail"] == "no token within 2s" and got["b"]["front"]["timed_out"] is True
    assert got["a"]["front"]["timed_out"] is False
