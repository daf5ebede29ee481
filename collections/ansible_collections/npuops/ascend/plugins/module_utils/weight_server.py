# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The read-only weight server: a model directory's manifest and the files it lists, to peers with the token.

Serves only manifest paths (anything else, ``..``, absolute paths, symlinks out of the directory: 404), to
requests that carry the run's token (401 without, 403 wrong; logged without the token); Range requests; the
body goes out with sendfile. It also serves a file still arriving on this node: the bytes this node's copy
has received so far, as they land (cut-through). Every receiver checks every piece against the seed's
manifest itself, so a relay never needs to vouch for what it forwards, and the nodes form a pipelined chain
(seed -> n1 -> n2 ...) where 1->N costs about one copy plus a fraction of a second per hop. A relay whose
own copy is not running (ended, failed, killed) does not keep its downstream waiting: it answers 503 or
closes the connection, and the downstream asks another peer. ``/ping`` answers at once: what a client asks
to tell a peer that waits for its own upstream from one that is frozen or gone. It exits after an idle
timeout.

Self-contained, standard library only: weight_serve writes this file out and runs it as its own process,
``python3 npuops_weight_server.py serve --root R --bind A --port P --token-file F --run-id ID`` (the token
file is read and deleted, so the secret is in no command line and no log; the run id names the run that
started it, so a later run can end it).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import hmac
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

try:  # Python 3
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from socketserver import ThreadingMixIn
    from urllib.parse import unquote
except ImportError:  # pragma: no cover - Python 2 is not supported on the nodes
    BaseHTTPRequestHandler = HTTPServer = ThreadingMixIn = unquote = None

STATE_DIR = ".npuops"
PROGRESS_SUFFIX = ".part.progress"
SCRIPT_NAME = "npuops_weight_server.py"
# a copy whose progress file was not rewritten for this long is not running (the client rewrites it every 2 s)
LIVE_SECONDS = 15
# a request for bytes still arriving looks again after 1 ms, then 2, 4, ... at most 16 ms: a relay adds little
# latency per hop, and many waiting requests cost little CPU
POLL_FIRST, POLL_MAX = 0.001, 0.016
# a file this node's running copy has not started yet is waited for this long (the nodes of a chain start
# their files at about the same time: the one before answers as soon as its .part is there, instead of every
# node taking its files' first piece from further up the chain, the seed most of all)
START_WAIT = 3.0

# <file>.part.progress is one fixed-width record the receiving client rewrites in place (no temporary file,
# nothing left over by a full disk): pieces checked, bytes received, and a CRC of both, so a reader that
# races the writer sees a record that does not check rather than a wrong number.
_RECORD = "%012d %016d "
RECORD_BYTES = len(_RECORD % (0, 0)) + 9


def manifest_path(root):
    return os.path.join(root, STATE_DIR, "manifest.json")


def sync_progress_path(root):
    return os.path.join(root, STATE_DIR, "sync-progress.json")


def encode_progress(checked, received):
    head = _RECORD % (checked, received)
    return ("%s%08x\n" % (head, zlib.crc32(head.encode("ascii")) & 0xffffffff)).encode("ascii")


def decode_progress(raw):
    """(pieces checked, bytes received or None) from a progress record; None when it does not check.

    A record of an older version is one decimal number of pieces checked (received: None, unknown)."""
    try:
        text = raw.decode("ascii")
    except (UnicodeDecodeError, AttributeError):
        return None
    if len(raw) == RECORD_BYTES and text.endswith("\n"):
        head, crc = text[:-9], text[-9:-1]
        try:
            if int(crc, 16) == zlib.crc32(head.encode("ascii")) & 0xffffffff:
                checked, received = head.split()
                return int(checked), int(received)
        except ValueError:
            return None
        return None
    stripped = text.strip()
    return (int(stripped), None) if stripped.isdigit() else None


def read_progress(final_path, tries=3):
    """(pieces checked, bytes received or None) of `<final_path>.part`; (0, 0) when there is no record."""
    for _attempt in range(tries):
        try:
            with open(final_path + PROGRESS_SUFFIX, "rb") as f:
                got = decode_progress(f.read(64))
        except (IOError, OSError):
            return 0, 0
        if got is not None:
            return got
        time.sleep(0.001)  # raced the writer: read again
    return 0, 0


def local_copy_running(root, now=None):
    """Whether this node's own copy into `root` is running (its progress was rewritten lately)."""
    try:
        with open(sync_progress_path(root)) as f:
            state = json.load(f)
    except (IOError, OSError, ValueError):
        return False
    now = time.time() if now is None else now
    return state.get("state") == "running" and now - float(state.get("updated") or 0) < LIVE_SECONDS


def send_range(sock, fileobj, offset, count, timeout):
    """`count` bytes of `fileobj` from `offset` with sendfile(2) on the socket made blocking for it: each
    call moves as much as the peer takes, without a poll and a call per socket buffer (the send timeout
    still bounds a peer that stops reading). -> bytes sent; fewer when the peer went away or stalled."""
    sent = 0
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(timeout), 0))
    try:
        while sent < count:
            try:
                n = os.sendfile(sock.fileno(), fileobj.fileno(), offset + sent, count - sent)
            except BlockingIOError:
                break  # the send timeout: the peer took nothing for `timeout` seconds
            if not n:
                break
            sent += n
    finally:
        sock.settimeout(timeout)
    return sent


class _Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


class _Gone(Exception):
    """The bytes of a file still arriving stopped coming (this node's copy ended or stalled)."""


class WeightServer(object):
    """Serves `root` on bind:port to clients with `token` (see module docstring)."""

    def __init__(self, root, bind, port, token, idle_timeout=600, wait_timeout=300, log=None, run_id=None):
        self.root = os.path.realpath(root)
        self.token = token.encode("utf-8")
        self.idle_timeout = idle_timeout
        self.wait_timeout = wait_timeout
        self.run_id = run_id
        self.log_file = log
        self.active = 0
        self.last = time.time()
        self.lock = threading.Lock()
        self._manifest = (None, None)
        self._live = (0.0, False)
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

    def copy_running(self):
        """local_copy_running, looked up at most once a second for all requests."""
        now = time.time()
        checked_at, running = self._live
        if now - checked_at > 1.0:
            running = local_copy_running(self.root, now)
            self._live = (now, running)
        return running

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

    def locate(self, rel, entry):
        """(path, complete) of a servable copy of `rel`: the whole file, or the .part still arriving;
        (None, reason) when there is none."""
        final = os.path.join(self.root, rel)
        real = os.path.realpath(final)
        if not real.startswith(self.root + os.sep) or real != os.path.abspath(final):
            return None, "outside the model directory"
        try:
            if os.path.getsize(final) == entry["size"] and not os.path.islink(final):
                return final, True
        except OSError:
            pass
        if os.path.exists(final + ".part"):
            return final + ".part", False
        return None, "not here yet"

    def received(self, rel, entry, piece):
        """Bytes of `rel` this node has received so far: its copy's progress record, or the whole file once
        the copy renamed it into place (and removed the record)."""
        final = os.path.join(self.root, rel)
        checked, received = read_progress(final)
        if (checked, received) == (0, 0) and self.locate(rel, entry)[1] is True:
            return entry["size"]
        return checked * piece if received is None else received

    def open_servable(self, rel, entry):
        """(open file, complete) of a servable copy of `rel` (wait_to_start), or (None, reason). A .part renamed
        into place between finding it and opening it is opened under its final name."""
        for _attempt in range(2):
            path, complete = self.wait_to_start(rel, entry)
            if path is None:
                return None, complete
            try:
                return open(path, "rb"), complete
            except IOError as e:
                if e.errno != errno.ENOENT:
                    raise
        return None, "not here yet"

    def wait_to_start(self, rel, entry):
        """locate(), waiting up to START_WAIT for a file this node's running copy has not started yet."""
        deadline = time.time() + START_WAIT
        pause = POLL_FIRST
        while True:
            path, complete = self.locate(rel, entry)
            if path is not None or complete != "not here yet" or time.time() > deadline or not self.copy_running():
                return path, complete
            self.touch()
            time.sleep(pause)
            pause = min(pause * 2, POLL_MAX)

    def wait_for(self, rel, entry, piece, want):
        """Wait until more than `want` bytes of `rel` arrived; -> bytes received. Raises _Gone when this
        node's copy is not running or nothing arrived for wait_timeout."""
        deadline = time.time() + self.wait_timeout
        pause = POLL_FIRST
        while True:
            got = self.received(rel, entry, piece)
            if got > want:
                return got
            if not self.copy_running():
                raise _Gone("this node's copy is not running")
            if time.time() > deadline:
                raise _Gone("nothing arrived for %ss" % self.wait_timeout)
            self.touch()
            time.sleep(pause)
            pause = min(pause * 2, POLL_MAX)

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "npuops-weights/2"
            timeout = 120  # a peer that stops reading does not hold a thread forever

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
                if self.path == "/ping":
                    return self.reply(200, b"ok\n")
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
                f, complete = server.open_servable(rel, entry)
                if f is None:
                    code = 404 if complete == "outside the model directory" else 503
                    server.log("%d %s from %s (%s)" % (code, rel, peer, complete))
                    return self.reply(code, (complete + "\n").encode(), extra={"Retry-After": "1"})
                with f:
                    piece = int(manifest.get("piece_size") or 1)
                    available = end + 1
                    if not complete:
                        try:
                            available = min(server.wait_for(rel, entry, piece, start), end + 1)
                        except _Gone as e:
                            server.log("503 %s from %s (%s)" % (rel, peer, e))
                            return self.reply(503, ("%s\n" % e).encode(), extra={"Retry-After": "1"})
                    self.send_body(f, rel, entry, piece, start, end, available, rng is not None)

            def send_body(self, f, rel, entry, piece, start, end, available, ranged):
                """The bytes [start, end] of open file `f`; of a file still arriving, each as soon as it is here."""
                self.send_response(206 if ranged else 200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(end - start + 1))
                if ranged:
                    self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, entry["size"]))
                self.end_headers()
                self.wfile.flush()
                pos = start
                while True:
                    if available > pos:
                        sent = send_range(self.connection, f, pos, available - pos, self.timeout)
                        pos += sent
                        if pos < available:
                            break
                    if pos > end:
                        return
                    try:
                        got = server.wait_for(rel, entry, piece, pos)
                    except _Gone as e:
                        server.log("%s from %s: closed at byte %d (%s)" % (rel, self.client_address[0], pos, e))
                        break
                    available = min(got, end + 1)
                self.close_connection = True  # fewer bytes than announced: the client asks another peer

        return Handler


def serve_main(argv):
    """python3 npuops_weight_server.py serve --root R --bind A --port P --token-file F [--run-id ID]
    [--idle-timeout S] [--log L]"""
    args = dict(zip(argv[::2], argv[1::2]))
    with open(args["--token-file"]) as f:
        token = f.read().strip()
    os.unlink(args["--token-file"])  # the secret lives only in this process from here on
    log = open(args["--log"], "a") if args.get("--log") else None
    srv = WeightServer(args["--root"], args["--bind"], int(args["--port"]), token,
                       idle_timeout=float(args.get("--idle-timeout", 600)), log=log, run_id=args.get("--run-id"))
    srv.log("serving %s on %s:%d for run %s" % (srv.root, args["--bind"], srv.port, srv.run_id))
    sys.stdout.write("ready %d\n" % srv.port)
    sys.stdout.flush()
    os.close(1)
    srv.serve_forever()
    return 0


def launch(python, script, root, bind, port, token_file, idle_timeout, log_path, run_id="", timeout=15):
    """Start `script` (this file) as a detached server; -> (pid, None) once it listens, or (None, error)."""
    log = open(log_path, "a")
    argv = [python, script, "serve", "--root", root, "--bind", bind, "--port", str(port), "--token-file", token_file,
            "--idle-timeout", str(idle_timeout), "--log", log_path]
    if run_id:
        argv += ["--run-id", run_id]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, close_fds=True,
                            start_new_session=True)
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
    sys.stderr.write("usage: npuops_weight_server.py serve --root R --bind A --port P --token-file F\n")
    raise SystemExit(2)
