# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Peer-to-peer weight transfer, the client side (the server is weight_server.py).

The client fetches the manifest, skips files already verified and fetches the rest, several files at a
time (each on a thread of its own: receiving, hashing and writing release the GIL, so the files in flight
spread over the host's cores), each file's bytes in order into ``<file>.part``, in one request per file
and peer. Bytes are hashed as they arrive and written at once, so this node's own server can relay them
downstream while they land; each piece's sha256 is checked against the seed's manifest before the piece
counts (a file whose pieces all match is the seed's file), then the file is fsynced and renamed. A killed
copy resumes from its last checked piece. A bad piece is fetched again once (another peer first), then the
copy fails naming the file, the piece and both digests.

CPU per byte: the receiver copies each byte once, from the socket into an aligned buffer, hashes it there
and writes it to disk with O_DIRECT (the disk reads it from that buffer, no copy into the page cache and no
writeback of dirty pages), where the file system supports it; reads stay within a piece and aligned, so
only a file's tail (or a resume at an odd byte) goes through the page cache. The sender uses sendfile(2).

Peers fail in three ways, each handled without waiting on it again: refused or unreachable (a short connect
timeout), gone mid-transfer (the connection breaks), or frozen (a frozen server accepts connections and
answers nothing). A watchdog looks at every transfer: when a peer has sent nothing for ``peer_timeout``
seconds it is pinged on a second connection; a peer that is only waiting for its own upstream answers, a
frozen or powered-off one does not and is routed around. A failed peer stays demoted (tried last) for a
backoff that doubles up to a minute; a background probe restores it once it answers again. The transfer
goes on from the byte where it stopped, with the next peer.

Page cache: a checkpoint larger than memory must not pile up dirty pages. Written with O_DIRECT it leaves
none. Written through the page cache (``keep_cache``, for a prewarm, or a file system without O_DIRECT),
writeback of each piece starts as soon as it is checked, and a window of pieces later the copy waits for
that piece to be on disk and drops its pages (unless ``keep_cache``), so the memory a copy holds stays
bounded whatever the checkpoint's size (sync_file_range(2), posix_fadvise(2) POSIX_FADV_DONTNEED).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import errno
import hashlib
import json
import mmap
import os
import socket
import threading
import time

try:  # Python 3
    from urllib.parse import quote, urlparse
except ImportError:  # pragma: no cover - Python 2 is not supported on the nodes
    quote = urlparse = None

from ansible_collections.npuops.ascend.plugins.module_utils import workers
from ansible_collections.npuops.ascend.plugins.module_utils.manifest import (
    file_sha256, piece_digest, save_json, stray_files)
from ansible_collections.npuops.ascend.plugins.module_utils.weight_server import (
    PROGRESS_SUFFIX, STATE_DIR, encode_progress, manifest_path, read_progress, sync_progress_path)

CONNECT_TIMEOUT = 3.0
PING_TIMEOUT = 3.0
# bytes received per read, adapted to the rate: large reads when the data flows (fewer calls and wake-ups
# per byte: up to a whole piece per read, which measured 5 % less CPU per byte, both ends, than 1 MiB), small
# ones when it trickles (a relay forwards what it received after each read: the hop's latency)
CHUNK_MIN, CHUNK = 64 * 1024, 4 * 1024 * 1024
READ_FAST, READ_SLOW = 0.005, 0.02
# O_DIRECT wants buffer, offset and length aligned to the device's logical block (512 or 4096 bytes)
DIRECT_ALIGN = 4096
# write-behind: a piece this many pieces behind the newest checked one is waited for and dropped
WRITEBACK_WINDOW = 8
BACKOFF_FIRST, BACKOFF_MAX = 2.0, 60.0
PROGRESS_EVERY = 2.0
RATE_WINDOW = 10.0


class TransferError(Exception):
    """A copy that cannot go on; the message names the file and what to do."""


class ChecksumError(TransferError):
    pass


class DiskFullError(TransferError):
    pass


class _Aborted(TransferError):
    """Another file of the same copy failed: this one stops too."""


class PeerError(Exception):
    """One request to one peer failed (unreachable, broken, frozen, refused); another peer is asked."""


class NotHere(Exception):
    """The peer answers but does not have the bytes (not yet, or its own copy is not running)."""


# ------------------------------------------------------------------------------------------ page cache

SYNC_FILE_RANGE_WAIT_BEFORE, SYNC_FILE_RANGE_WRITE, SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4


def _load_sync_file_range():
    """sync_file_range(2) from the C library: the os module has posix_fadvise but not this one."""
    try:
        import ctypes
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (ImportError, OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range()


def _fadvise_dontneed(fd, offset, length):
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def start_writeback(fd, offset, length):
    """Start writing [offset, offset+length) to disk without waiting for it."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, SYNC_FILE_RANGE_WRITE)
    else:
        _fadvise_dontneed(fd, offset, length)  # on dirty pages this starts their writeback


def settle(fd, offset, length, drop):
    """Wait until [offset, offset+length) is on disk, then (with `drop`) take its pages out of the cache."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length,
                         SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER)
    if drop:
        _fadvise_dontneed(fd, offset, length)


def open_direct(path):
    """A descriptor that writes `path` with O_DIRECT, or None where the file system does not support it."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        raise


def aligned_buffer(size):
    """A page-aligned buffer of `size` bytes (what O_DIRECT writes from)."""
    return memoryview(mmap.mmap(-1, size))


class PartFile(object):
    """One file being received: ``<final>.part``, its progress record, how it is written (O_DIRECT, or
    the page cache with write-behind), and the end (finish: fsync and rename; abandon: leave the checked
    prefix for a resume, or remove it)."""

    def __init__(self, final, entry, piece, keep_cache=False):
        self.final, self.entry, self.piece, self.keep_cache = final, entry, piece, keep_cache
        self.size = entry["size"]
        self.fd = os.open(final + ".part", os.O_RDWR | os.O_CREAT, 0o644)
        # the page cache is what a prewarm wants to keep; otherwise the disk reads straight from our buffer
        self.dfd = None if keep_cache else open_direct(final + ".part")
        self.pfd = None
        self.checked = 0
        self.received = 0
        self.settled = 0  # pieces [0, settled) are on disk (and, unless keep_cache, out of the page cache)

    def span(self, index):
        start = index * self.piece
        return start, min(start + self.piece, self.size) - start

    def resume(self):
        """Keep the checked prefix of an existing .part (each piece hashed again); -> pieces kept."""
        pieces = self.entry["pieces"]
        have = os.fstat(self.fd).st_size
        ok = 0
        for i in range(min(read_progress(self.final)[0], len(pieces))):
            offset, length = self.span(i)
            if offset + length > have:
                break
            data = os.pread(self.fd, length, offset)
            if len(data) != length or piece_digest(data) != pieces[i]:
                break
            ok = i + 1
        os.ftruncate(self.fd, min(ok * self.piece, self.size))
        self.checked = self.settled = ok
        self.received = min(ok * self.piece, self.size)
        self.pfd = os.open(self.final + PROGRESS_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
        self.publish()
        return ok

    def allocate(self):
        # claim the space up front: a full disk fails here, before any byte of the file is fetched
        if self.size and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(self.fd, 0, self.size)

    def publish(self):
        os.pwrite(self.pfd, encode_progress(self.checked, self.received), 0)

    def write(self, data, offset):
        """`data` (from an aligned_buffer when aligned writes are to go direct) at `offset`."""
        written = 0
        if self.dfd is not None and not offset % DIRECT_ALIGN and not len(data) % DIRECT_ALIGN:
            try:
                while written < len(data):
                    written += os.pwrite(self.dfd, data[written:], offset + written)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: a buffer that is not aligned; the page cache takes it
                    raise
        while written < len(data):
            written += os.pwrite(self.fd, data[written:], offset + written)

    def received_to(self, offset):
        self.received = offset
        self.publish()

    def piece_checked(self, index):
        offset, length = self.span(index)
        self.checked = index + 1
        self.received = max(self.received, offset + length)
        self.publish()
        if self.dfd is not None:
            return  # on disk already (a file's unaligned tail is in the cache until the fsync)
        start_writeback(self.fd, offset, length)
        while self.settled <= index - WRITEBACK_WINDOW:
            settle(self.fd, self.settled * self.piece, self.piece, not self.keep_cache)
            self.settled += 1

    def rewind(self, index):
        """A piece failed its check: what was received of it does not count (a relay stops serving it)."""
        self.received = index * self.piece
        self.publish()

    def finish(self):
        os.fsync(self.fd)  # the direct writes' metadata and the device's cache too
        if not self.keep_cache:
            _fadvise_dontneed(self.fd, 0, 0)
        for fd in (self.fd, self.dfd):
            if fd is not None:
                os.close(fd)
        self.fd = self.dfd = None
        os.rename(self.final + ".part", self.final)
        self.abandon(remove=False)
        _unlink(self.final + PROGRESS_SUFFIX)
        parent = os.open(os.path.dirname(self.final), os.O_RDONLY)
        try:
            os.fsync(parent)
        finally:
            os.close(parent)

    def abandon(self, remove):
        for fd in (self.fd, self.dfd, self.pfd):
            if fd is not None:
                os.close(fd)
        self.fd = self.dfd = self.pfd = None
        if remove:
            for leftover in (self.final + ".part", self.final + PROGRESS_SUFFIX):
                _unlink(leftover)


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------- peers

class Connection(object):
    """One keep-alive HTTP/1.1 connection to a peer. Bodies are read straight into the caller's buffer;
    data reads block without a timeout (the watchdog ends a stalled one), pings and manifests have one."""

    def __init__(self, host, port, connect_timeout=CONNECT_TIMEOUT):
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), connect_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending = b""
        self.remaining = 0
        self.reusable = True

    def request(self, path, token, rng=None, timeout=None):
        """Send a GET and read the response head; -> (status, {lower-case header: value})."""
        self.sock.settimeout(timeout)
        lines = ["GET %s HTTP/1.1" % path, "Host: %s:%d" % (self.host, self.port), "Authorization: Bearer " + token]
        if rng:
            lines.append("Range: bytes=%d-%d" % rng)
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = bytearray(self.pending)
        while b"\r\n\r\n" not in head:
            more = self.sock.recv(65536)
            if not more:
                raise PeerError("closed the connection before answering")
            head += more
            if len(head) > 65536:
                raise PeerError("sent a response head of more than 64 KiB")
        raw, _sep, rest = bytes(head).partition(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            raise PeerError("sent %r, not an HTTP response" % lines[0][:80])
        headers = {}
        for line in lines[1:]:
            name, _sep, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.remaining = int(headers.get("content-length") or 0)
        self.pending = rest
        if headers.get("connection", "").lower() == "close":
            self.reusable = False
        return status, headers

    def readinto(self, view):
        """Up to len(view) bytes of the body; 0 when the peer closed before the end of it. Without a timeout
        (data) the whole of it unless the peer closes: what came with the response head, then the rest."""
        want = min(len(view), self.remaining)
        n = 0
        if self.pending:
            n = min(want, len(self.pending))
            view[:n] = self.pending[:n]
            self.pending = self.pending[n:]
        waitall = self.sock.gettimeout() is None
        if n < want and not self.pending and (waitall or not n):
            # a whole chunk per call when the data flows (fewer wake-ups); the watchdog ends a stalled read
            n += self.sock.recv_into(view[n:], want - n, socket.MSG_WAITALL if waitall else 0)
        self.remaining -= n
        return n

    def read_body(self, limit=None):
        out = bytearray()
        buf = bytearray(min(self.remaining, 1 << 20) or 1)
        while self.remaining and (limit is None or len(out) < limit):
            n = self.readinto(memoryview(buf))
            if not n:
                raise PeerError("closed the connection %d bytes before the end of the body" % self.remaining)
            out += buf[:n]
        if self.remaining:
            self.reusable = False
        return bytes(out)

    def abort(self):
        """From another thread: end a read that waits (the connection is not used again)."""
        self.reusable = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except (socket.error, OSError):
            pass

    def close(self):
        try:
            self.sock.close()
        except (socket.error, OSError):
            pass


class Peer(object):
    """One upstream node, its place in the order of preference and its health."""

    def __init__(self, url, rank):
        u = urlparse(url)
        if u.scheme != "http" or not u.hostname:
            raise TransferError("src_url %r: expected http://host:port" % url)
        self.url, self.host, self.port, self.rank = url, u.hostname, u.port or 80, rank
        self.demoted = False
        self.retry_at = 0.0
        self.backoff = 0.0
        self.reason = None

    def __str__(self):
        return self.url


class Peers(object):
    """The upstream peers of one copy, shared by its threads: order of preference (healthy ones by rank,
    then demoted ones, soonest retry first), demotion with backoff, and a connection per peer per thread."""

    def __init__(self, urls, token, connect_timeout=CONNECT_TIMEOUT, clock=time.time):
        self.peers = [Peer(u, i) for i, u in enumerate(urls)]
        self.token = token
        self.connect_timeout = connect_timeout
        self.clock = clock
        self.lock = threading.Lock()
        self.local = threading.local()
        self.t0 = clock()
        self.failures = []

    def __len__(self):
        return len(self.peers)

    def order(self, avoid=()):
        with self.lock:
            healthy = sorted((p for p in self.peers if not p.demoted), key=lambda p: p.rank)
            demoted = sorted((p for p in self.peers if p.demoted), key=lambda p: (p.retry_at, p.rank))
        ranked = healthy + demoted
        return [p for p in ranked if p not in avoid] + [p for p in ranked if p in avoid]

    def demote(self, peer, reason):
        with self.lock:
            if peer.demoted and self.clock() < peer.retry_at:
                return
            peer.backoff = min(peer.backoff * 2, BACKOFF_MAX) if peer.backoff else BACKOFF_FIRST
            peer.retry_at = self.clock() + peer.backoff
            if not peer.demoted:
                self.failures.append({"peer": peer.url, "reason": reason, "at": round(self.clock() - self.t0, 1)})
            peer.demoted, peer.reason = True, reason

    def restore(self, peer):
        with self.lock:
            peer.demoted, peer.backoff, peer.reason = False, 0.0, None

    def due(self):
        """Demoted peers whose backoff ended: to probe again."""
        now = self.clock()
        with self.lock:
            return [p for p in self.peers if p.demoted and now >= p.retry_at]

    def connection(self, peer):
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        conn = conns.get(peer.url)
        if conn is None or not conn.reusable:
            if conn is not None:
                conn.close()
            try:
                conn = Connection(peer.host, peer.port, self.connect_timeout)
            except (socket.error, OSError) as e:
                conns.pop(peer.url, None)
                self.demote(peer, "cannot connect: %s" % e)
                raise PeerError("%s: cannot connect: %s" % (peer, e))
            conns[peer.url] = conn
        return conn

    def drop(self, peer):
        conn = (getattr(self.local, "conns", None) or {}).pop(peer.url, None)
        if conn is not None:
            conn.close()

    def ping(self, peer, timeout=PING_TIMEOUT):
        """Whether the peer's server answers at all (a fresh connection, bounded)."""
        try:
            conn = Connection(peer.host, peer.port, min(timeout, self.connect_timeout))
        except (socket.error, OSError):
            return False
        try:
            status, _h = conn.request("/ping", self.token, timeout=timeout)
            conn.read_body(64)
            return status == 200
        except (socket.error, OSError, PeerError):
            return False
        finally:
            conn.close()

    def get(self, peer, path, timeout):
        """A small GET (manifest): -> (status, body)."""
        conn = self.connection(peer)
        try:
            status, _h = conn.request(path, self.token, timeout=timeout)
            return status, conn.read_body()
        except (socket.error, OSError, PeerError) as e:
            self.drop(peer)
            raise PeerError("%s: %s" % (peer, e))


class Transfer(object):
    """One request in flight, as the watchdog sees it."""

    def __init__(self, peer, conn, now):
        self.peer, self.conn = peer, conn
        self.last = self.pinged = now
        self.stalled = None


class Watchdog(object):
    """Ends transfers whose peer sent nothing for `peer_timeout` and does not answer a ping, and probes
    demoted peers once their backoff ended. One thread per copy."""

    def __init__(self, peers, peer_timeout, stall_timeout=300, clock=time.time):
        self.peers = peers
        self.peer_timeout = peer_timeout
        self.stall_timeout = stall_timeout
        self.clock = clock
        self.active = set()
        self.probing = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = None

    def begin(self, peer, conn):
        t = Transfer(peer, conn, self.clock())
        with self.lock:
            self.active.add(t)
        return t

    def end(self, t):
        with self.lock:
            self.active.discard(t)

    def look(self):
        """One round (the thread calls it twice a second)."""
        now = self.clock()
        with self.lock:
            quiet = [t for t in self.active if now - max(t.last, t.pinged) > self.peer_timeout and not t.stalled]
        for t in quiet:
            t.pinged = self.clock()
            if t.peer.demoted:
                t.stalled = t.peer.reason or "demoted"  # another transfer found it frozen: no second ping
            elif t.pinged - t.last > self.stall_timeout:
                t.stalled = "sent nothing for %ds although it answers pings" % self.stall_timeout
            elif self.peers.ping(t.peer):
                continue  # it answers: it waits for its own upstream
            else:
                t.stalled = "sent nothing for %ds and did not answer a ping" % self.peer_timeout
            self.peers.demote(t.peer, t.stalled)
            t.conn.abort()
        for peer in self.peers.due():
            if peer not in self.probing:
                # probed on a thread of its own: a peer that does not answer must not hold up this loop
                self.probing.add(peer)
                probe = threading.Thread(target=self.probe, args=(peer,))
                probe.daemon = True
                probe.start()

    def probe(self, peer):
        try:
            if self.peers.ping(peer):
                self.peers.restore(peer)
            else:
                self.peers.demote(peer, peer.reason or "does not answer")
        finally:
            self.probing.discard(peer)

    def run(self):
        while not self.stopped.wait(0.5):
            self.look()

    def start(self):
        self.thread = threading.Thread(target=self.run)
        self.thread.daemon = True
        self.thread.start()

    def stop(self):
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(PING_TIMEOUT * 3)


def fetch_manifest(peers, deadline, timeout=10):
    """The manifest from the first peer that serves it; -> (manifest, peer). `timeout`: the longest a peer
    may stay silent (a frozen one is demoted, the next one asked)."""
    last = None
    while True:
        for peer in peers.order():
            try:
                status, body = peers.get(peer, "/manifest", timeout)
            except PeerError as e:
                peers.demote(peer, str(e))
                last = str(e)
                continue
            if status == 200:
                try:
                    return json.loads(body.decode("utf-8")), peer
                except ValueError as e:
                    last = "%s sent a manifest that is not JSON: %s" % (peer, e)
                    continue
            if status in (401, 403):
                raise TransferError("%s refused the token (%d): the servers were started with another token "
                                    "(a different run?)" % (peer, status))
            last = "%s answered %d" % (peer, status)
        if time.time() > deadline:
            raise TransferError("no peer served the manifest (%s)" % last)
        time.sleep(0.5)


# ------------------------------------------------------------------------------------------- progress

class Progress(object):
    """The copy's progress, rewritten every couple of seconds for the controller (and this node's server,
    which tells from it whether the copy runs). The rate is that of the last few seconds."""

    def __init__(self, path, run_id, files_total, bytes_total, clock=time.time):
        self.path, self.run_id = path, run_id
        self.files_total, self.bytes_total = files_total, bytes_total
        self.files_done = self.bytes_done = self.bytes_fetched = 0
        self.clock = clock
        self.start = clock()
        self.samples = collections.deque([(self.start, 0)])
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def add(self, fetched=0, done_bytes=0, files=0):
        with self.lock:
            self.bytes_fetched += fetched
            self.bytes_done += done_bytes
            self.files_done += files

    def sample(self):
        now = self.clock()
        with self.lock:
            self.samples.append((now, self.bytes_fetched))
            while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW:
                self.samples.popleft()

    def snapshot(self, state="running"):
        now = self.clock()
        with self.lock:
            t_first, b_first = self.samples[0]
            span = now - t_first
            rate = (self.bytes_fetched - b_first) / span if span > 0 else 0.0
            left = max(self.bytes_total - self.bytes_done, 0)
            # an ETA from less than two seconds of data says nothing
            eta = round(left / rate) if rate > 0 and now - self.start >= 2.0 and state == "running" else None
            return {"state": state, "run_id": self.run_id, "pid": os.getpid(), "files_total": self.files_total,
                    "files_done": self.files_done, "bytes_total": self.bytes_total, "bytes_done": self.bytes_done,
                    "bytes_fetched": self.bytes_fetched, "mb_per_s": round(rate / 1e6, 1), "eta_s": eta,
                    "seconds": round(now - self.start, 1), "updated": now}

    def write(self, state="running"):
        if self.path:
            save_json(self.path, self.snapshot(state), durable=False)

    def run(self, every=PROGRESS_EVERY):
        while not self.stop.wait(every):
            self.sample()
            self.write()

    def finish(self, reporter, state):
        """Stop the reporter thread, then write the final state (never two writers at once)."""
        self.stop.set()
        reporter.join()
        self.write(state)


# --------------------------------------------------------------------------------------------- copy

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


def space_needed(dest, manifest, todo):
    """Bytes the files to fetch still need on disk: their sizes minus what their .part (preallocated) and
    the stale copies they replace already hold."""
    need = 0
    for rel in todo:
        held = 0
        for path in (os.path.join(dest, rel), os.path.join(dest, rel) + ".part"):
            try:
                held += os.stat(path).st_blocks * 512
            except OSError:
                pass
        need += max(manifest["files"][rel]["size"] - held, 0)
    return need


def free_bytes(path):
    """Free bytes (for unprivileged use) of the file system `path` is on, or would be created on."""
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class _BadPiece(Exception):
    """A piece did not match the manifest: the stream that brought it stops, the piece is asked for again."""


class Run(object):
    """The pieces of one file still to receive, in order: the piece arriving (its digest so far, the peers
    that sent bytes of it, its attempt), where the bytes have reached, and each piece's check as it ends."""

    def __init__(self, part, rel, entry, first, progress):
        self.part, self.rel, self.entry, self.progress = part, rel, entry, progress
        self.pieces = entry["pieces"]
        self.size = entry["size"]
        self.delivered = 0  # bytes any peer delivered, checked or not (stall detection)
        self.avoid = []
        self._begin(first, attempt=1)
        while not self.done() and self.length == 0:  # an empty file's one piece: the digest of nothing
            self._check()

    def _begin(self, index, attempt):
        self.index, self.attempt = index, attempt
        if index < len(self.pieces):
            self.start, self.length = self.part.span(index)
        self.pos = self.start if index < len(self.pieces) else self.size
        self.sha = hashlib.sha256()
        self.sources = []

    def done(self):
        return self.index >= len(self.pieces)

    def room(self, size):
        """How much the next read may take: at most `size`, never past the piece's end (a digest per piece
        without a copy), aligned (O_DIRECT): up to the next aligned offset from an odd one, a whole number of
        blocks before a file's last odd bytes."""
        n = min(size, self.start + self.length - self.pos)
        odd = self.pos % DIRECT_ALIGN
        if odd:
            return min(n, DIRECT_ALIGN - odd)
        return n - n % DIRECT_ALIGN if n > DIRECT_ALIGN else n  # a file's tail: its last odd bytes alone

    def arrived(self, data, peer):
        """`data` (at most room() bytes) from `peer`: hashed, written, announced to this node's server;
        -> raises _BadPiece when it ended a piece that does not match."""
        n = len(data)
        self.sha.update(data)
        self.part.write(data, self.pos)
        self.pos += n
        self.delivered += n
        if peer not in self.sources:
            self.sources.append(peer)
        self.part.received_to(self.pos)
        self.progress.add(fetched=n)
        if self.pos == self.start + self.length:
            self._check()

    def _check(self):
        got, want = self.sha.hexdigest()[:32], self.pieces[self.index]
        if got == want:
            self.part.piece_checked(self.index)
            self.progress.add(done_bytes=self.length)
            self.avoid = []
            self._begin(self.index + 1, attempt=1)
            return
        self.part.rewind(self.index)
        if self.attempt > 1:
            raise ChecksumError(
                "%s: piece %d (bytes %d-%d) has sha256 %s, the seed's manifest says %s, twice; the source changed "
                "since the manifest was recorded (record it again) or a copy is corrupt"
                % (self.rel, self.index, self.start, self.start + self.length - 1, got, want))
        self.avoid = self.sources  # a bad piece: ask again, another peer first
        self._begin(self.index, attempt=2)
        raise _BadPiece()


class Copier(object):
    """Fetches files from `peers` into `dest` (see the module docstring)."""

    def __init__(self, peers, dest, manifest, progress, stall_timeout=300, watchdog=None, keep_cache=False):
        self.peers = peers
        self.dest = dest
        self.manifest = manifest
        self.piece = int(manifest["piece_size"])
        self.progress = progress
        self.stall_timeout = stall_timeout
        self.watchdog = watchdog
        self.keep_cache = keep_cache
        self.resumed_bytes = 0
        self.lock = threading.Lock()
        self.abort = threading.Event()
        self.disk_full = False
        self.local = threading.local()

    def buffer(self):
        buf = getattr(self.local, "buf", None)
        if buf is None:
            buf = self.local.buf = aligned_buffer(CHUNK)
        return buf

    def _stream(self, peer, run):
        """The rest of run's file from `peer` in one request, each read into run.arrived as it comes. -> True
        when it stopped at a piece's end for a peer now preferred to this one (a relay whose .part was not
        there yet when asked): the chain's nodes pull from the node before them, not all from the seed."""
        rel = run.rel
        conn = self.peers.connection(peer)
        t = self.watchdog.begin(peer, conn) if self.watchdog else None
        try:
            try:
                status, _headers = conn.request("/files/" + quote(rel), self.peers.token, (run.pos, run.size - 1))
                if status != 206:
                    body = conn.read_body(200)
                    if status in (401, 403):
                        raise TransferError("%s refused the token (%d) for %s" % (peer, status, rel))
                    if status in (404, 503):
                        raise NotHere("%s: %s" % (peer, body.decode("utf-8", "replace").strip() or status))
                    raise PeerError("%s answered %d %r" % (peer, status, body))
            except (socket.error, OSError) as e:
                raise PeerError(str(e))
            buf = self.buffer()
            size = CHUNK_MIN
            while conn.remaining:
                if self.abort.is_set():
                    raise _Aborted("stopped: another file of this copy failed")
                began = time.time()
                try:
                    n = conn.readinto(buf[:run.room(size)])
                except (socket.error, OSError) as e:
                    raise PeerError(str(e))
                took = time.time() - began
                if took < READ_FAST:
                    size = min(size * 2, CHUNK)
                elif took > READ_SLOW:
                    size = max(size // 2, CHUNK_MIN)
                if not n:
                    conn.reusable = False
                    if t is not None and t.stalled:
                        raise PeerError(t.stalled)
                    # a relay closes early when its own copy stopped: it is there, it has no more
                    raise NotHere("%s closed the transfer at byte %d" % (peer, run.pos))
                if t is not None:
                    t.last = self.watchdog.clock()
                index = run.index
                run.arrived(buf[:n], peer)
                if run.index != index and not run.done() and self.peers.order(run.avoid)[0] is not peer:
                    return True
            return False
        except PeerError as e:
            self.peers.drop(peer)
            reason = (t.stalled if t is not None and t.stalled else None) or str(e)
            self.peers.demote(peer, reason)
            raise PeerError("%s: %s" % (peer, reason))
        except NotHere:
            if not conn.reusable:
                self.peers.drop(peer)
            raise
        finally:
            if conn.remaining:  # left mid-body (a bad piece, a failed copy): the connection is not used again
                conn.reusable = False
                self.peers.drop(peer)
            if t is not None:
                self.watchdog.end(t)

    def _fetch_pieces(self, part, rel, entry, first):
        """Pieces `first`.. of `rel` into place and checked, from the peers in their order; a peer that fails
        or has no more is left from the byte where it stopped for the next one."""
        run = Run(part, rel, entry, first, self.progress)
        last_progress = time.time()
        last = None
        while not run.done():
            again = False  # a bad piece, or a preferred peer to go back to: look at the order again at once
            for peer in self.peers.order(run.avoid):
                before = run.delivered
                try:
                    again = self._stream(peer, run)
                except (PeerError, NotHere) as e:
                    last = str(e)
                except _BadPiece:
                    again = True
                if run.delivered > before:
                    last_progress = time.time()
                if again or run.done():
                    break
            if again or run.done():
                continue
            if time.time() - last_progress > self.stall_timeout:
                raise TransferError("%s piece %d: no peer delivered it within %ds (%s)" % (
                    rel, run.index, self.stall_timeout, last))
            if self.abort.is_set():
                raise _Aborted("stopped: another file of this copy failed")
            time.sleep(0.2)  # every peer said "not yet" or failed: look again

    def _disk_full(self, rel, entry):
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
        # a stale copy under the final name must not be served to the next node as if it were this one
        _unlink(final)
        _unlink(final + PROGRESS_SUFFIX + ".tmp")  # left by older versions
        part = PartFile(final, entry, self.piece, self.keep_cache)
        try:
            start = part.resume()
            resumed = min(start * self.piece, entry["size"])
            with self.lock:
                self.resumed_bytes += resumed
            self.progress.add(done_bytes=resumed)
            part.allocate()
            if self.abort.is_set():
                raise _Aborted("stopped: another file of this copy failed")
            self._fetch_pieces(part, rel, entry, start)
            part.finish()
        except Exception as e:
            full = isinstance(e, OSError) and e.errno == errno.ENOSPC
            if full:
                self.disk_full = True
            self.abort.set()  # the copy fails: its other files stop at once (their .part kept for a resume)
            part.abandon(remove=self.disk_full)  # on a full disk every .part goes: they hold its space
            if full:
                raise self._disk_full(rel, entry)
            raise
        self.progress.add(files=1)
        return os.stat(final)


def sync(src_urls, token, dest, manifest=None, parallel=4, verify="fast", check_only=False, stall_timeout=300,
         manifest_timeout=60, prewarm=False, peer_timeout=10, keep_cache=False, run_id=None):
    """Make `dest` a verified copy of the peers' model directory. -> result dict (see weight_sync RETURN)."""
    t0 = time.time()
    peers = Peers(src_urls, token)
    if manifest is None:
        if not src_urls:
            raise TransferError("give src_url (peers to pull from) or a manifest")
        manifest, _peer = fetch_manifest(peers, time.time() + manifest_timeout, peer_timeout)
    for rel in manifest["files"]:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise TransferError("the manifest lists %r, which is not a path inside the model directory" % rel)
    verified, todo, (cache_path, cache) = plan(manifest, dest, verify)
    result = {"files_total": len(manifest["files"]), "files_verified": len(verified), "files_to_fetch": todo,
              "bytes_to_fetch": sum(manifest["files"][r]["size"] for r in todo), "changed": bool(todo),
              "files_fetched": 0, "bytes_fetched": 0, "stray": stray_files(dest, manifest["files"])}
    if todo and not check_only:
        result.update(_fetch(peers, dest, manifest, verified, todo, cache, cache_path, parallel, stall_timeout,
                             manifest_timeout, peer_timeout, keep_cache or prewarm, run_id))
    elif cache and not check_only:
        save_json(cache_path, cache, durable=False)
    secs = time.time() - t0
    result.update(seconds=round(secs, 3), mb_per_s=round(result["bytes_fetched"] / secs / 1e6, 1) if secs > 0 else 0.0)
    if prewarm and not check_only:
        t1 = time.time()
        read_into_page_cache(dest, manifest["files"])
        result["prewarm_seconds"] = round(time.time() - t1, 3)
    return result


def _fetch(peers, dest, manifest, verified, todo, cache, cache_path, parallel, stall_timeout, manifest_timeout,
           peer_timeout, keep_cache, run_id):
    """Fetch the `todo` files, recording each verified one in the cache. -> the fetch half of sync's result."""
    if not len(peers):
        raise TransferError("%d files must be fetched but no src_url was given" % len(todo))
    if any("pieces" not in manifest["files"][r] for r in todo):
        # the controller plans with the manifest's summary; the piece digests come from the peers
        full, peer = fetch_manifest(peers, time.time() + manifest_timeout, peer_timeout)
        differ = sorted(r for r, e in manifest["files"].items() if full["files"].get(r, {}).get("sha256") != e["sha256"])
        if differ:
            raise TransferError("%s serves a manifest that differs from the seed's for %s; record the seed's manifest "
                                "again and rerun" % (peer, ", ".join(differ[:5])))
        manifest = full
    need, free = space_needed(dest, manifest, todo), free_bytes(dest)
    if need > free:
        raise DiskFullError("%s needs %.1f GB more for the %d files to fetch, %.1f GB are free: free space there "
                            "(nothing was fetched)" % (dest, need / 1e9, len(todo), free / 1e9))
    # kept next to the weights: our own server relays from it, and later runs can plan from it
    save_json(manifest_path(dest), manifest, durable=False)
    progress = Progress(sync_progress_path(dest), run_id, len(manifest["files"]),
                        sum(e["size"] for e in manifest["files"].values()))
    progress.add(done_bytes=sum(manifest["files"][r]["size"] for r in verified), files=len(verified))
    progress.write()
    reporter = threading.Thread(target=progress.run)
    reporter.daemon = True
    reporter.start()
    watchdog = Watchdog(peers, peer_timeout, stall_timeout)
    watchdog.start()
    copier = Copier(peers, dest, manifest, progress, stall_timeout=stall_timeout, watchdog=watchdog,
                    keep_cache=keep_cache)
    lock = threading.Lock()

    def fetch_one(rel):
        st = copier.fetch(rel)
        with lock:
            cache[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": manifest["files"][rel]["sha256"]}

    try:
        workers.for_each(todo, fetch_one, parallel)
    except Exception:
        watchdog.stop()
        try:
            progress.finish(reporter, "failed")
            save_json(cache_path, cache, durable=False)
        except (IOError, OSError):
            pass  # the copy's own error is the one to report (a full disk fails these writes too)
        raise
    watchdog.stop()
    progress.finish(reporter, "done")
    save_json(cache_path, cache, durable=False)
    return {"files_fetched": len(todo), "bytes_fetched": progress.bytes_fetched,
            "bytes_resumed": copier.resumed_bytes, "peer_failures": peers.failures}


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
