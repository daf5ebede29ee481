# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HAProxy agent check of the npuops gateway: says, per backend server, whether its engine makes progress.

HAProxy's own HTTP check (GET /health) says whether an engine lives; it does not queue behind the load, so a busy
engine is never marked down for being busy. It cannot tell a wedged engine (its API answers /health while no token
comes out, as when a collective hangs). This agent can: every second it reads the engine's /metrics (served by the
API server, not queued either) and answers HAProxy's agent check on its own port with

  up    while requests are served and the engine steps (tokens come out, or prompt chunks are computed), or nothing
        is in flight and a one-token request answers;
  down  when requests are in flight (running or waiting) and neither the generated-token counter nor the engine's
        step counter has moved for stall_seconds, or an idle engine does not answer a one-token request.

HAProxy takes one "down" from an agent as down (the agent check's rise and fall are 1), and "up" back as up while its
HTTP check passes.

It never answers "ready", "drain" or "maint": the administrative state (a rolling update's drain) stays HAProxy's.
A server without /metrics (a prefill/decode proxy) is always "up" here: HAProxy's HTTP check alone decides.

Usage: npuops_gateway_agent.py CONFIG.json   (SIGHUP restarts it in place, reading code and configuration anew;
       the engines' API key is in the configuration: mode 0600)
CONFIG: {"bind": "127.0.0.1", "stall_seconds": 5, "interval": 1, "probe_timeout": 3, "api_key": "...",
         "servers": [{"name": "a-1", "agent_port": 18710, "url": "http://10.0.0.11:8000", "model": "kimi-k3"}]}
"""
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request

# What says an engine serves is defined once, in the collection's module_utils/engine_progress.py: the gateway role
# installs it beside this file; run from the collection's tree, it is found there.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "..", "plugins", "module_utils")]
import engine_progress  # noqa: E402  pylint: disable=wrong-import-position


def read_metrics(url, timeout):
    """-> {running, waiting, generated: (tokens, steps)} summed over the engine's DP ranks, or None without
    /metrics."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout) as resp:
            if resp.status != 200:
                return None
            text = resp.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    reading = engine_progress.progress_reading(text)
    if reading is None:
        return None
    return {"running": reading["running"], "waiting": reading["waiting"],
            "generated": (reading["generated"], reading["steps"])}


def one_token(url, model, api_key, timeout):
    body = json.dumps(engine_progress.one_token_request(model)).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    req = urllib.request.Request(url + "/v1/completions", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status == 200 and engine_progress.token_came(json.loads(resp.read().decode("utf-8")))
    except (OSError, ValueError):
        return False


class Watch(object):
    """One backend server: the verdict HAProxy reads, kept by a poller."""

    def __init__(self, server, config):
        self.server = server
        self.config = config
        self.verdict = "up"
        self.last_generated = None
        self.progress_at = time.time()
        self.probed_at = 0.0
        self.stop = threading.Event()

    def judge(self, now, metrics, probe):
        """The verdict from one reading of the metrics (None: the server has none); `probe()` asks an idle engine
        for one token."""
        if metrics is None:
            return "up"
        if self.last_generated is None or metrics["generated"] != self.last_generated:
            self.last_generated = metrics["generated"]
            self.progress_at = now
        if metrics["running"] + metrics["waiting"] > 0:
            stalled = now - self.progress_at
            return "down" if stalled >= float(self.config["stall_seconds"]) else "up"
        if now - self.probed_at >= float(self.config.get("probe_every", 5)):
            self.probed_at = now
            if not probe():
                return "down"
            self.progress_at = time.time()
            return "up"
        return self.verdict  # idle between probes: the last verdict holds

    def poll(self):
        url, timeout = self.server["url"], float(self.config.get("probe_timeout", 3))
        while not self.stop.is_set():
            metrics = read_metrics(url, timeout)
            self.verdict = self.judge(time.time(), metrics, lambda: one_token(
                url, self.server.get("model"), self.config.get("api_key"), timeout))
            self.stop.wait(float(self.config.get("interval", 1)))

    def serve(self):
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((self.config.get("bind", "127.0.0.1"), int(self.server["agent_port"])))
        srv.listen(16)
        srv.settimeout(1.0)
        while not self.stop.is_set():
            try:
                conn, _peer = srv.accept()
            except socket.timeout:
                continue
            try:
                # HAProxy's agent protocol: one ASCII line, then the connection is closed
                conn.sendall(("%s\n" % self.verdict).encode())
            except OSError:
                pass
            finally:
                conn.close()
        srv.close()


def run(path):
    # SIGHUP: start again in place (same pid), reading the code and the configuration anew
    signal.signal(signal.SIGHUP, lambda *_: os.execv(sys.executable, [sys.executable] + sys.argv))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(path) as f:
        config = json.load(f)
    watches = [Watch(s, config) for s in config["servers"]]
    for w in watches:
        for target in (w.poll, w.serve):
            threading.Thread(target=target, daemon=True).start()
    sys.stdout.write("npuops gateway agent: %d servers, stall %ss\n" % (len(watches), config["stall_seconds"]))
    sys.stdout.flush()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    run(sys.argv[1])
