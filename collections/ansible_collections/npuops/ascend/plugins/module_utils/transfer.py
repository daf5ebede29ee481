# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Peer-to-peer weight transfer, the client side (the server is weight_server.py).

The client fetches the manifest, skips files already verified, fetches the rest several at a time into
``<file>.part`` — each piece's sha256 checked on arrival against the seed's manifest, so a file whose
pieces all match is the seed's file — then fsyncs and renames. A killed copy resumes from its last
checked piece. A bad piece is fetched again once (from the next peer when there is one), then the copy
fails naming the file, the piece and both digests.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import json
import os
import socket
import threading
import time

try:  # Python 3
    import http.client as httplib
    from urllib.parse import quote, urlparse
except ImportError:  # pragma: no cover - Python 2 is not supported on the nodes
    httplib = quote = urlparse = None

from ansible_collections.npuops.ascend.plugins.module_utils import workers
from ansible_collections.npuops.ascend.plugins.module_utils.manifest import file_sha256, piece_digest, save_json
from ansible_collections.npuops.ascend.plugins.module_utils.weight_server import (
    PROGRESS_SUFFIX, STATE_DIR, manifest_path, read_progress, write_progress)


class TransferError(Exception):
    """A copy that cannot go on; the message names the file and what to do."""


class ChecksumError(TransferError):
    pass


class DiskFullError(TransferError):
    pass


# --------------------------------------------------------------------------------------------- client

class Source(object):
    """One upstream peer, with a keep-alive connection per thread."""

    def __init__(self, url, token, timeout=60):
        u = urlparse(url)
        if u.scheme != "http" or not u.hostname:
            raise TransferError("src_url %r: expected http://host:port" % url)
        self.url, self.host, self.port = url, u.hostname, u.port or 80
        self.headers = {"Authorization": "Bearer " + token}
        self.timeout = timeout
        self.local = threading.local()

    def conn(self):
        c = getattr(self.local, "conn", None)
        if c is None:
            c = httplib.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.local.conn = c
        return c

    def reset(self):
        c = getattr(self.local, "conn", None)
        if c is not None:
            c.close()
        self.local.conn = None

    def get(self, path, rng=None):
        headers = dict(self.headers)
        if rng:
            headers["Range"] = "bytes=%d-%d" % rng
        try:
            conn = self.conn()
            conn.request("GET", path, headers=headers)
            return conn.getresponse()
        except (socket.error, OSError, httplib.HTTPException):
            self.reset()
            raise

    def __str__(self):
        return self.url


def fetch_manifest(sources, deadline):
    last = None
    while True:
        for src in sources:
            try:
                resp = src.get("/manifest")
                body = resp.read()
                if resp.status == 200:
                    return json.loads(body.decode("utf-8")), src
                if resp.status in (401, 403):
                    raise TransferError("%s refused the token (%d): the servers were started with another token "
                                        "(a different run?)" % (src, resp.status))
                last = "%s answered %d" % (src, resp.status)
            except (socket.error, OSError, httplib.HTTPException, ValueError) as e:
                last = "%s: %s" % (src, e)
        if time.time() > deadline:
            raise TransferError("no peer served the manifest (%s)" % last)
        time.sleep(0.5)


class Progress(object):
    def __init__(self, path, files_total, bytes_total):
        self.path = path
        self.files_total, self.bytes_total = files_total, bytes_total
        self.files_done = 0
        self.bytes_done = 0
        self.bytes_fetched = 0
        self.start = time.time()
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def add(self, fetched=0, done_bytes=0, files=0):
        with self.lock:
            self.bytes_fetched += fetched
            self.bytes_done += done_bytes
            self.files_done += files

    def snapshot(self, state="running"):
        with self.lock:
            secs = max(time.time() - self.start, 1e-6)
            rate = self.bytes_fetched / secs
            left = max(self.bytes_total - self.bytes_done, 0)
            return {"state": state, "files_total": self.files_total, "files_done": self.files_done,
                    "bytes_total": self.bytes_total, "bytes_done": self.bytes_done,
                    "bytes_fetched": self.bytes_fetched, "mb_per_s": round(rate / 1e6, 1),
                    "eta_s": round(left / rate) if rate > 0 else None, "seconds": round(secs, 1),
                    "updated": time.time()}

    def write(self, state="running"):
        if self.path:
            save_json(self.path, self.snapshot(state), durable=False)

    def run(self, every=2.0):
        while not self.stop.wait(every):
            self.write()

    def finish(self, reporter, state):
        """Stop the reporter thread, then write the final state (never two writers at once)."""
        self.stop.set()
        reporter.join()
        self.write(state)


def _verified_cache(dest):
    path = os.path.join(dest, STATE_DIR, "verified.json")
    try:
        with open(path) as f:
            return path, json.load(f)
    except (IOError, OSError, ValueError):
        return path, {}


def plan(manifest, dest, verify="fast"):
    """Which files are already here and verified, which must be fetched. -> (verified, to_fetch, cache)."""
    cache_path, cache = _verified_cache(dest)
    verified, todo = [], []
    for rel, entry in sorted(manifest["files"].items()):
        final = os.path.join(dest, rel)
        try:
            st = os.stat(final)
        except OSError:
            todo.append(rel)
            continue
        known = cache.get(rel) or {}
        if st.st_size == entry["size"] and verify == "fast" and known.get("sha256") == entry["sha256"] and \
                known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns:
            verified.append(rel)
            continue
        if st.st_size == entry["size"] and file_sha256(final) == entry["sha256"]:
            cache[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": entry["sha256"]}
            verified.append(rel)
            continue
        todo.append(rel)
    return verified, todo, (cache_path, cache)


class Copier(object):
    """Fetches files from `sources` (in order of preference) into `dest`."""

    def __init__(self, sources, dest, manifest, progress, stall_timeout=300):
        self.sources = sources
        self.dest = dest
        self.manifest = manifest
        self.piece = int(manifest["piece_size"])
        self.progress = progress
        self.stall_timeout = stall_timeout
        self.resumed_bytes = 0
        self.lock = threading.Lock()

    def _read_piece(self, rel, entry, index, into):
        """One piece from the first source that has it; waits while upstream is still receiving it."""
        start = index * self.piece
        end = min(start + self.piece, entry["size"]) - 1
        want = end - start + 1
        deadline = time.time() + self.stall_timeout
        last = None
        order = list(self.sources)
        while True:
            for src in order:
                try:
                    resp = src.get("/files/" + quote(rel), (start, end))
                    if resp.status == 503:
                        resp.read()
                        last = "%s does not have it yet" % src
                        continue
                    if resp.status not in (200, 206):
                        body = resp.read()[:200]
                        if resp.status in (401, 403):
                            raise TransferError("%s refused the token (%d) for %s" % (src, resp.status, rel))
                        last = "%s answered %d %r" % (src, resp.status, body)
                        continue
                    got = 0
                    view = memoryview(into)
                    while got < want:
                        n = resp.readinto(view[got:want])
                        if not n:
                            break
                        got += n
                    if got != want:
                        src.reset()
                        last = "%s sent %d of %d bytes" % (src, got, want)
                        continue
                    return view[:want], src
                except (socket.error, OSError, httplib.HTTPException) as e:
                    if isinstance(e, OSError) and getattr(e, "errno", None) == errno.ENOSPC:
                        raise
                    last = "%s: %s" % (src, e)
                    # prefer the others next time: this one may be gone (the chain routes around it)
                    order = [s for s in order if s is not src] + [src]
            if time.time() > deadline:
                raise TransferError("%s piece %d: no peer delivered it within %ds (%s)" % (
                    rel, index, self.stall_timeout, last))
            time.sleep(0.2)

    def _resume(self, final, entry, fd):
        """Keep the checked prefix of an existing .part; -> pieces already done."""
        pieces = entry["pieces"]
        size = os.fstat(fd).st_size
        ok = 0
        for i in range(min(read_progress(final), len(pieces))):
            offset = i * self.piece
            length = min(self.piece, entry["size"] - offset)
            if offset + length > size:
                break
            data = os.pread(fd, length, offset)
            if len(data) != length or piece_digest(data) != pieces[i]:
                break
            ok = i + 1
        os.ftruncate(fd, min(ok * self.piece, entry["size"]))
        return ok

    def _write_piece(self, fd, data, offset):
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], offset + written)

    def _disk_full(self, rel, entry, final):
        for leftover in (final + ".part", final + PROGRESS_SUFFIX):
            if os.path.exists(leftover):
                os.unlink(leftover)
        st = os.statvfs(self.dest)
        return DiskFullError("disk full while writing %s (%d bytes free under %s, the file needs %d); nothing "
                             "was renamed into place" % (rel, st.f_bavail * st.f_frsize, self.dest, entry["size"]))

    def fetch(self, rel):
        """Fetch one file into place, every piece checked on arrival; -> its stat."""
        entry = self.manifest["files"][rel]
        final = os.path.join(self.dest, rel)
        parent = os.path.dirname(final)
        if not os.path.isdir(parent):
            os.makedirs(parent)
        buf = bytearray(self.piece)
        fd = os.open(final + ".part", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            start = self._resume(final, entry, fd)
            resumed = min(start * self.piece, entry["size"])
            with self.lock:
                self.resumed_bytes += resumed
            self.progress.add(done_bytes=resumed)
            if entry["size"] and hasattr(os, "posix_fallocate"):
                # claim the space up front: a full disk fails here, before any byte is fetched, and
                # writes into allocated blocks cost the kernel less than growing the file
                os.posix_fallocate(fd, 0, entry["size"])
            for index in range(start, len(entry["pieces"])):
                want = entry["pieces"][index]
                data, got = None, None
                for _ask in (1, 2):
                    data, src = self._read_piece(rel, entry, index, buf)
                    got = piece_digest(data)
                    if got == want:
                        break
                    # a bad piece: ask again, another peer first
                    self.sources = [s for s in self.sources if s is not src] + [src]
                    data = None
                if data is None:
                    first = index * self.piece
                    last = min(first + self.piece, entry["size"]) - 1
                    raise ChecksumError("%s: piece %d (bytes %d-%d) has sha256 %s, the seed's manifest says %s, twice; "
                                        "the source changed since the manifest was recorded (record it again) or a "
                                        "copy is corrupt" % (rel, index, first, last, got, want))
                self._write_piece(fd, data, index * self.piece)
                write_progress(final, index + 1)
                self.progress.add(fetched=len(data), done_bytes=len(data))
            os.fsync(fd)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                os.close(fd)
                fd = None
                raise self._disk_full(rel, entry, final)
            raise
        finally:
            if fd is not None:
                os.close(fd)
        os.rename(final + ".part", final)
        if os.path.exists(final + PROGRESS_SUFFIX):
            os.unlink(final + PROGRESS_SUFFIX)
        dfd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self.progress.add(files=1)
        return os.stat(final)


def sync(src_urls, token, dest, manifest=None, parallel=4, verify="fast", check_only=False, stall_timeout=300,
         manifest_timeout=60, prewarm=False):
    """Make `dest` a verified copy of the peers' model directory. -> result dict (see weight_sync RETURN)."""
    t0 = time.time()
    sources = [Source(u, token) for u in src_urls]
    if manifest is None:
        if not sources:
            raise TransferError("give src_url (peers to pull from) or a manifest")
        manifest, _src = fetch_manifest(sources, time.time() + manifest_timeout)
    for rel in manifest["files"]:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise TransferError("the manifest lists %r, which is not a path inside the model directory" % rel)
    verified, todo, (cache_path, cache) = plan(manifest, dest, verify)
    result = {"files_total": len(manifest["files"]), "files_verified": len(verified), "files_to_fetch": todo,
              "bytes_to_fetch": sum(manifest["files"][r]["size"] for r in todo), "changed": bool(todo),
              "files_fetched": 0, "bytes_fetched": 0}
    if todo and not check_only:
        result.update(_fetch(sources, dest, manifest, verified, todo, cache, cache_path, parallel, stall_timeout,
                             manifest_timeout))
    elif cache and not check_only:
        save_json(cache_path, cache, durable=False)
    secs = time.time() - t0
    result.update(seconds=round(secs, 3), mb_per_s=round(result["bytes_fetched"] / secs / 1e6, 1) if secs > 0 else 0.0)
    if prewarm and not check_only:
        t1 = time.time()
        read_into_page_cache(dest, manifest["files"])
        result["prewarm_seconds"] = round(time.time() - t1, 3)
    return result


def _fetch(sources, dest, manifest, verified, todo, cache, cache_path, parallel, stall_timeout, manifest_timeout):
    """Fetch the `todo` files, recording each verified one in the cache. -> the fetch half of sync's result."""
    if not sources:
        raise TransferError("%d files must be fetched but no src_url was given" % len(todo))
    if any("pieces" not in manifest["files"][r] for r in todo):
        # the controller plans with the manifest's summary; the piece digests come from the peers
        full, src = fetch_manifest(sources, time.time() + manifest_timeout)
        differ = sorted(r for r, e in manifest["files"].items() if full["files"].get(r, {}).get("sha256") != e["sha256"])
        if differ:
            raise TransferError("%s serves a manifest that differs from the seed's for %s; record the seed's manifest "
                                "again and rerun" % (src, ", ".join(differ[:5])))
        manifest = full
    # kept next to the weights: our own server relays from it, and later runs can plan from it
    save_json(manifest_path(dest), manifest, durable=False)
    progress = Progress(os.path.join(dest, STATE_DIR, "sync-progress.json"), len(manifest["files"]),
                        sum(e["size"] for e in manifest["files"].values()))
    progress.add(done_bytes=sum(manifest["files"][r]["size"] for r in verified), files=len(verified))
    reporter = threading.Thread(target=progress.run)
    reporter.daemon = True
    reporter.start()
    copier = Copier(sources, dest, manifest, progress, stall_timeout=stall_timeout)
    lock = threading.Lock()

    def fetch_one(rel):
        st = copier.fetch(rel)
        with lock:
            cache[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": manifest["files"][rel]["sha256"]}

    try:
        workers.for_each(todo, fetch_one, parallel)
    except Exception:
        try:
            progress.finish(reporter, "failed")
            save_json(cache_path, cache, durable=False)
        except (IOError, OSError):
            pass  # the copy's own error is the one to report (a full disk fails these writes too)
        raise
    progress.finish(reporter, "done")
    save_json(cache_path, cache, durable=False)
    return {"files_fetched": len(todo), "bytes_fetched": progress.bytes_fetched,
            "bytes_resumed": copier.resumed_bytes}


def read_into_page_cache(dest, files, parallel=8, chunk=8 * 1024 * 1024):
    """Read every file once, several at a time, so the engine's weight load comes from memory. -> bytes read."""
    lock = threading.Lock()
    total = [0]

    def read_all(rel):
        buf = bytearray(chunk)
        got = 0
        with open(os.path.join(dest, rel), "rb", buffering=0) as f:
            n = f.readinto(buf)
            while n:
                got += n
                n = f.readinto(buf)
        with lock:
            total[0] += got

    workers.for_each(sorted(files), read_all, parallel)
    return total[0]
