# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The read-only weight server: a model directory's manifest and the files it lists, to peers with the token.

Serves only manifest paths (anything else, ``..``, absolute paths, symlinks out of the directory: 404), to
requests that carry the run's token (401 without, 403 wrong; logged without the token); Range requests; the
body goes out with sendfile. It also serves a file still arriving on this node, piece by piece as pieces
are checked, which is what lets the nodes form a pipelined chain (seed -> n1 -> n2 ...) where 1->N costs
about one copy. It exits after an idle timeout.

Self-contained, standard library only: weight_serve writes this file out and runs it as its own process,
``python3 weight_server.py serve --root R --bind A --port P --token-file F`` (the token file is read and
deleted, so the secret is in no command line and no log).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hmac
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time

try:  # Python 3
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from socketserver import ThreadingMixIn
    from urllib.parse import unquote
except ImportError:  # pragma: no cover - Python 2 is not supported on the nodes
    BaseHTTPRequestHandler = HTTPServer = ThreadingMixIn = unquote = None

STATE_DIR = ".npuops"
PROGRESS_SUFFIX = ".part.progress"


def manifest_path(root):
    return os.path.join(root, STATE_DIR, "manifest.json")


def read_progress(final_path):
    """Pieces of `<final_path>.part` already checked (written by the client as it goes)."""
    try:
        with open(final_path + PROGRESS_SUFFIX) as f:
            return int(f.read().strip() or 0)
    except (IOError, OSError, ValueError):
        return 0


def write_progress(final_path, pieces):
    tmp = final_path + PROGRESS_SUFFIX + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(pieces))
    os.rename(tmp, final_path + PROGRESS_SUFFIX)


class _Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class WeightServer(object):
    """Serves `root` on bind:port to clients with `token` (see module docstring)."""

    def __init__(self, root, bind, port, token, idle_timeout=600, wait_timeout=300, log=None):
        self.root = os.path.realpath(root)
        self.token = token.encode("utf-8")
        self.idle_timeout = idle_timeout
        self.wait_timeout = wait_timeout
        self.log_file = log
        self.active = 0
        self.last = time.time()
        self.lock = threading.Lock()
        self._manifest = (None, None)
        handler = self._handler()
        self.httpd = _Server((bind, port), handler)
        self.port = self.httpd.server_address[1]

    def log(self, line):
        if self.log_file:
            self.log_file.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), line))
            self.log_file.flush()

    def manifest(self):
        """The manifest, reloaded when its file changes (a relaying node writes it once it has it)."""
        path = manifest_path(self.root)
        try:
            st = os.stat(path)
        except OSError:
            return None, None
        key = (st.st_mtime_ns, st.st_size)
        if self._manifest[0] != key:
            with open(path, "rb") as f:
                raw = f.read()
            self._manifest = (key, (json.loads(raw.decode("utf-8")), raw))
        return self._manifest[1]

    def touch(self, delta=0):
        with self.lock:
            self.active += delta
            self.last = time.time()

    def idle_watch(self):
        while True:
            time.sleep(min(5.0, max(0.2, self.idle_timeout / 4.0)))
            with self.lock:
                idle = self.active == 0 and time.time() - self.last > self.idle_timeout
            if idle:
                self.log("idle for %ss: stopping" % self.idle_timeout)
                self.httpd.shutdown()
                return

    def serve_forever(self):
        watcher = threading.Thread(target=self.idle_watch)
        watcher.daemon = True
        watcher.start()
        self.httpd.serve_forever(poll_interval=0.2)
        self.httpd.server_close()

    def locate(self, rel, entry, start, end):
        """(path, available) of a servable copy of `rel` covering [start, end], waiting for pieces still
        arriving; (None, reason) when it does not come within wait_timeout."""
        final = os.path.join(self.root, rel)
        real = os.path.realpath(final)
        if not real.startswith(self.root + os.sep) or real != os.path.abspath(final):
            return None, "outside the model directory"
        deadline = time.time() + self.wait_timeout
        piece = self.manifest()[0].get("piece_size") or 1
        while True:
            try:
                if os.path.getsize(final) == entry["size"] and not os.path.islink(final):
                    return final, entry["size"]
            except OSError:
                pass
            part = final + ".part"
            available = min(read_progress(final) * piece, entry["size"])
            if available > end and os.path.exists(part):
                return part, available
            if time.time() > deadline:
                return None, "not here yet"
            self.touch()
            time.sleep(0.01)  # a relay's downstream waits at most this long past a piece's arrival

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "npuops-weights/1"

            def log_message(self, fmt, *args):  # silence the default stderr log; we log without headers
                pass

            def reply(self, code, body=b"", ctype="text/plain", extra=None):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if body:
                    self.wfile.write(body)

            def do_GET(self):
                server.touch(+1)
                try:
                    self.handle_get()
                except (socket.error, OSError):
                    self.close_connection = True
                finally:
                    server.touch(-1)

            def handle_get(self):
                auth = self.headers.get("Authorization") or ""
                peer = self.client_address[0]
                if not auth.startswith("Bearer "):
                    server.log("401 %s from %s (no token)" % (self.path[:200], peer))
                    return self.reply(401, b"token required\n", extra={"WWW-Authenticate": "Bearer"})
                if not hmac.compare_digest(auth[7:].strip().encode("utf-8"), server.token):
                    server.log("403 %s from %s (wrong token)" % (self.path[:200], peer))
                    return self.reply(403, b"wrong token\n")
                manifest, raw = server.manifest()
                if self.path == "/manifest":
                    if manifest is None:
                        return self.reply(503, b"no manifest yet\n", extra={"Retry-After": "1"})
                    return self.reply(200, raw, "application/json")
                if not self.path.startswith("/files/") or manifest is None:
                    return self.reply(404, b"not found\n")
                rel = unquote(self.path[len("/files/"):])
                entry = manifest["files"].get(rel)
                if entry is None or rel.startswith("/") or ".." in rel.split("/"):
                    server.log("404 %s from %s (not in the manifest)" % (self.path[:200], peer))
                    return self.reply(404, b"not in the manifest\n")
                size = entry["size"]
                start, end = 0, size - 1
                rng = self.headers.get("Range")
                if rng:
                    try:
                        unit, _sep, spec = rng.partition("=")
                        first, _dash, last = spec.partition("-")
                        start = int(first)
                        end = min(int(last), size - 1) if last else size - 1
                        if unit.strip() != "bytes" or start > end or start >= size:
                            raise ValueError(rng)
                    except ValueError:
                        return self.reply(416, b"bad range\n", extra={"Content-Range": "bytes */%d" % size})
                path, available = server.locate(rel, entry, start, end)
                if path is None:
                    code = 404 if available == "outside the model directory" else 503
                    server.log("%d %s from %s (%s)" % (code, rel, peer, available))
                    return self.reply(code, (available + "\n").encode(), extra={"Retry-After": "1"})
                count = end - start + 1
                with open(path, "rb") as f:
                    self.send_response(206 if rng else 200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(count))
                    if rng:
                        self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
                    self.end_headers()
                    self.wfile.flush()
                    sent = self.connection.sendfile(f, start, count)
                    if sent != count:
                        self.close_connection = True

        return Handler


def serve_main(argv):
    """python3 transfer.py serve --root R --bind A --port P --token-file F [--idle-timeout S] [--log L]"""
    args = dict(zip(argv[::2], argv[1::2]))
    with open(args["--token-file"]) as f:
        token = f.read().strip()
    os.unlink(args["--token-file"])  # the secret lives only in this process from here on
    log = open(args["--log"], "a") if args.get("--log") else None
    srv = WeightServer(args["--root"], args["--bind"], int(args["--port"]), token,
                       idle_timeout=float(args.get("--idle-timeout", 600)), log=log)
    srv.log("serving %s on %s:%d" % (srv.root, args["--bind"], srv.port))
    sys.stdout.write("ready %d\n" % srv.port)
    sys.stdout.flush()
    os.close(1)
    srv.serve_forever()
    return 0


def launch(python, script, root, bind, port, token_file, idle_timeout, log_path, timeout=15):
    """Start `script` (this file) as a detached server; -> (pid, None) once it listens, or (None, error)."""
    log = open(log_path, "a")
    proc = subprocess.Popen([python, script, "serve", "--root", root, "--bind", bind, "--port", str(port),
                             "--token-file", token_file, "--idle-timeout", str(idle_timeout), "--log", log_path],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, close_fds=True,
                            preexec_fn=os.setsid)
    ready = select.select([proc.stdout], [], [], timeout)[0]
    line = proc.stdout.readline().decode() if ready else ""
    log.close()
    if line.startswith("ready"):
        return proc.pid, None
    proc.kill()
    proc.wait()
    if os.path.exists(token_file):
        os.unlink(token_file)
    with open(log_path) as f:
        return None, f.read()[-1500:].strip() or "no output"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        raise SystemExit(serve_main(sys.argv[2:]))
    sys.stderr.write("usage: weight_server.py serve --root R --bind A --port P --token-file F\n")
    raise SystemExit(2)
