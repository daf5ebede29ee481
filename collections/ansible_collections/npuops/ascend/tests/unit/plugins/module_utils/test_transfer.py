# -*- coding: utf-8 -*-
"""The weight server and client over real TCP on loopback."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import filecmp
import http.client
import io
import json
import os
import shutil
import socket
import threading
import time

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import manifest, transfer, weight_server
from ansible_collections.npuops.ascend.tests.unit.plugins.module_utils.weights_helpers import model_dir

PIECE = 1 << 20
TOKEN = "t0ken-abc-123"


@pytest.fixture
def seed(tmp_path):
    root = model_dir(str(tmp_path / "seed"))
    m, _stats = manifest.build(root, piece_size=PIECE)
    manifest.save_json(weight_server.manifest_path(root), m)
    return root, m


class Running(object):
    def __init__(self, root, token=TOKEN, idle=30):
        self.log = io.StringIO() if str is not bytes else None
        self.srv = weight_server.WeightServer(root, "127.0.0.1", 0, token, idle_timeout=idle, wait_timeout=5,
                                              log=self.log)
        self.url = "http://127.0.0.1:%d" % self.srv.port
        self.thread = threading.Thread(target=self.srv.serve_forever)
        self.thread.daemon = True
        self.thread.start()

    def stop(self):
        self.srv.httpd.shutdown()
        self.thread.join(5)


@pytest.fixture
def server(seed):
    s = Running(seed[0])
    yield s
    s.stop()


def write_record(final, checked):
    """The progress record a killed copy leaves next to its .part."""
    with open(final + weight_server.PROGRESS_SUFFIX, "wb") as f:
        f.write(weight_server.encode_progress(checked, checked * PIECE))


def same_tree(a, b, m):
    return all(filecmp.cmp(os.path.join(a, r), os.path.join(b, r), shallow=False) for r in m["files"])


def test_full_copy_is_byte_identical_and_a_rerun_moves_nothing(seed, server, tmp_path):
    root, m = seed
    dest = str(tmp_path / "dest")
    first = transfer.sync([server.url], TOKEN, dest, parallel=3)
    assert first["changed"] and first["files_fetched"] == 5 and first["bytes_fetched"] == manifest.total_bytes(m)
    assert same_tree(root, dest, m)
    assert not [f for f in os.listdir(os.path.join(dest, "tokenizer")) if f.endswith(".part")]
    again = transfer.sync([server.url], TOKEN, dest)
    assert not again["changed"] and again["bytes_fetched"] == 0 and again["files_verified"] == 5


def test_the_progress_file_ends_with_the_final_state(seed, server, tmp_path):
    root, m = seed
    dest = str(tmp_path / "dest")
    transfer.sync([server.url], TOKEN, dest, parallel=3)
    with open(os.path.join(dest, ".npuops", "sync-progress.json")) as f:
        progress = json.load(f)
    assert progress["state"] == "done" and progress["files_done"] == 5
    assert progress["bytes_done"] == progress["bytes_total"] == manifest.total_bytes(m)


def test_prewarm_reads_every_file_of_a_verified_copy_planned_from_the_summary(seed, server, tmp_path):
    root, m = seed
    dest = str(tmp_path / "dest")
    transfer.sync([server.url], TOKEN, dest)
    os.unlink(weight_server.manifest_path(dest))  # the summary the controller passes is all prewarm needs
    out = transfer.sync([], "", dest, manifest=manifest.summary(m), prewarm=True)
    assert not out["changed"] and out["prewarm_seconds"] >= 0
    assert transfer.read_into_page_cache(dest, m["files"]) == manifest.total_bytes(m)
    assert "prewarm_seconds" not in transfer.sync([], "", dest, manifest=manifest.summary(m), prewarm=True,
                                                  check_only=True)


def test_a_killed_copy_resumes_with_less_than_one_file_resent(seed, server, tmp_path):
    root, m = seed
    dest = str(tmp_path / "dest")
    big = "model-00002-of-00003.safetensors"
    # what a kill leaves: three checked pieces of the big file, plus a half-written fourth
    os.makedirs(dest)
    data = open(os.path.join(root, big), "rb").read()
    with open(os.path.join(dest, big + ".part"), "wb") as f:
        f.write(data[:3 * PIECE + PIECE // 2])
    write_record(os.path.join(dest, big), 3)
    out = transfer.sync([server.url], TOKEN, dest)
    assert out["bytes_resumed"] == 3 * PIECE
    assert out["bytes_fetched"] == manifest.total_bytes(m) - 3 * PIECE
    assert same_tree(root, dest, m)


def test_a_resumed_part_with_a_bad_piece_is_refetched_from_there(seed, server, tmp_path):
    root, m = seed
    dest = str(tmp_path / "dest")
    big = "model-00002-of-00003.safetensors"
    os.makedirs(dest)
    data = bytearray(open(os.path.join(root, big), "rb").read()[:4 * PIECE])
    data[2 * PIECE + 7] ^= 0xFF
    open(os.path.join(dest, big + ".part"), "wb").write(bytes(data))
    write_record(os.path.join(dest, big), 4)
    out = transfer.sync([server.url], TOKEN, dest)
    assert out["bytes_resumed"] == 2 * PIECE and same_tree(root, dest, m)


def test_a_flipped_byte_at_the_destination_is_repaired_by_full_verify(seed, server, tmp_path):
    root, m = seed
    dest = str(tmp_path / "dest")
    transfer.sync([server.url], TOKEN, dest)
    victim = os.path.join(dest, "model-00003-of-00003.safetensors")
    st = os.stat(victim)
    with open(victim, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 1]))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only a full re-hash can tell
    assert transfer.sync([server.url], TOKEN, dest, verify="fast")["files_fetched"] == 0
    full = transfer.sync([server.url], TOKEN, dest, verify="full")
    assert full["files_to_fetch"] == ["model-00003-of-00003.safetensors"] and same_tree(root, dest, m)


def test_a_source_changed_after_the_manifest_fails_naming_the_file_and_both_digests(seed, server, tmp_path):
    root, m = seed
    victim = os.path.join(root, "model-00001-of-00003.safetensors")
    with open(victim, "r+b") as f:
        f.seek(PIECE + 10)
        b = f.read(1)
        f.seek(PIECE + 10)
        f.write(bytes([b[0] ^ 1]))
    dest = str(tmp_path / "dest")
    with pytest.raises(transfer.ChecksumError) as e:
        transfer.sync([server.url], TOKEN, dest, parallel=1, stall_timeout=2)
    assert "model-00001-of-00003.safetensors" in str(e.value) and "piece 1" in str(e.value)
    assert not os.path.exists(os.path.join(dest, "model-00001-of-00003.safetensors"))


def test_a_piece_that_does_not_match_the_manifest_names_file_piece_and_both_digests(seed, server, tmp_path):
    root, m = seed
    bad = json.loads(json.dumps(m))
    rel = "model-00002-of-00003.safetensors"
    real = bad["files"][rel]["pieces"][2]
    bad["files"][rel]["pieces"][2] = "0" * 32
    manifest.save_json(weight_server.manifest_path(root), bad)
    with pytest.raises(transfer.ChecksumError) as e:
        transfer.sync([server.url], TOKEN, str(tmp_path / "dest"), parallel=1)
    msg = str(e.value)
    assert rel in msg and "piece 2 (bytes %d-%d)" % (2 * PIECE, 3 * PIECE - 1) in msg
    assert "0" * 32 in msg and real in msg
    assert not os.path.exists(str(tmp_path / "dest" / rel))


def test_the_controller_plans_with_the_summary_and_the_pieces_come_from_the_peers(seed, server, tmp_path):
    root, m = seed
    out = transfer.sync([server.url], TOKEN, str(tmp_path / "dest"), manifest=manifest.summary(m))
    assert out["files_fetched"] == 5 and same_tree(root, str(tmp_path / "dest"), m)
    stale = manifest.summary(m)
    stale["files"]["config.json"]["sha256"] = "f" * 64
    with pytest.raises(transfer.TransferError, match="differs from the seed's for config.json"):
        transfer.sync([server.url], TOKEN, str(tmp_path / "other"), manifest=stale)


def raw_get(url, path, token=TOKEN):
    """GET `path` as given (no normalisation), with the token if any. -> (status, body)."""
    host, port = url[len("http://"):].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": "Bearer " + token} if token is not None else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_wrong_or_missing_token_is_refused_and_never_logged(server, tmp_path):
    assert raw_get(server.url, "/manifest", token=None)[0] == 401
    assert raw_get(server.url, "/manifest", token="guess")[0] == 403
    with pytest.raises(transfer.TransferError, match="refused the token"):
        transfer.sync([server.url], "guess", str(tmp_path / "dest"))
    log = server.log.getvalue()
    assert "403" in log and "401" in log and "guess" not in log and TOKEN not in log


@pytest.mark.parametrize("path", ["/files/../../etc/passwd", "/files/%2e%2e/%2e%2e/etc/passwd", "/files//etc/passwd",
                                  "/files/%2Fetc%2Fpasswd", "/files/passwd", "/files/.npuops/manifest.json",
                                  "/etc/passwd"])
def test_paths_outside_the_manifest_are_404(seed, server, path):
    os.symlink("/etc/passwd", os.path.join(seed[0], "passwd"))
    code, body = raw_get(server.url, path)
    assert code == 404 and b"root:" not in body


def test_a_manifest_file_swapped_for_a_symlink_is_not_served(seed, server):
    root, _m = seed
    victim = os.path.join(root, "config.json")
    os.unlink(victim)
    os.symlink("/etc/passwd", victim)
    code, body = raw_get(server.url, "/files/config.json")
    assert code == 404 and b"root:" not in body


def test_range_requests(seed, server):
    root, m = seed
    rel = "model-00001-of-00003.safetensors"
    data = open(os.path.join(root, rel), "rb").read()
    conn = transfer.Connection("127.0.0.1", server.srv.port)
    status, headers = conn.request("/files/" + rel, TOKEN, (100, 199))
    assert status == 206 and conn.read_body() == data[100:200]
    assert headers["content-range"] == "bytes 100-199/%d" % len(data)
    status, _headers = conn.request("/files/" + rel, TOKEN, (len(data) + 5, len(data) + 9))
    assert status == 416
    conn.read_body()
    conn.close()


def test_disk_full_fails_cleanly(seed, server, tmp_path, monkeypatch):
    dest = str(tmp_path / "dest")
    real = os.pwrite
    calls = {"n": 0}

    def full(fd, data, offset):
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(transfer.DiskFullError, match="disk full while writing .* nothing was renamed into place"):
        transfer.sync([server.url], TOKEN, dest, parallel=1)
    leftovers = [f for _r, _d, fs in os.walk(dest) for f in fs if ".part" in f]  # incl. no .part.progress.tmp
    assert leftovers == []
    with open(os.path.join(dest, ".npuops", "sync-progress.json")) as f:
        assert json.load(f)["state"] == "failed"


def test_a_copy_that_cannot_fit_fails_before_a_byte_moves(seed, server, tmp_path, monkeypatch):
    root, m = seed
    monkeypatch.setattr(transfer, "free_bytes", lambda path: 2 << 20)
    with pytest.raises(transfer.DiskFullError, match=r"needs 0\.0 GB more for the 5 files to fetch, 0\.0 GB are free"):
        transfer.sync([server.url], TOKEN, str(tmp_path / "dest"))
    assert not [f for _r, _d, fs in os.walk(str(tmp_path / "dest")) for f in fs if f.startswith("model-")]


def test_a_relay_serves_pieces_while_they_arrive_and_a_dead_peer_is_routed_around(seed, server, tmp_path):
    root, m = seed
    relay_dir = str(tmp_path / "relay")
    os.makedirs(relay_dir)
    relay = Running(relay_dir)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_url = "http://127.0.0.1:%d" % dead.getsockname()[1]
    dead.close()
    try:
        results = {}

        def pull(name, urls, dest):
            results[name] = transfer.sync(urls, TOKEN, dest, parallel=2, stall_timeout=30)

        # the tail asks the relay first; the relay is still receiving from the seed
        tail = threading.Thread(target=pull, args=("tail", [relay.url, server.url], str(tmp_path / "tail")))
        mid = threading.Thread(target=pull, args=("relay", [server.url], relay_dir))
        tail.start()
        time.sleep(0.2)
        mid.start()
        mid.join(60)
        tail.join(60)
        assert same_tree(root, relay_dir, m) and same_tree(root, str(tmp_path / "tail"), m)
        routed = transfer.sync([dead_url, relay.url], TOKEN, str(tmp_path / "third"))
        assert routed["files_fetched"] == 5 and same_tree(root, str(tmp_path / "third"), m)
    finally:
        relay.stop()


def test_check_only_reports_the_plan_without_fetching(seed, server, tmp_path):
    dest = str(tmp_path / "dest")
    out = transfer.sync([server.url], TOKEN, dest, check_only=True)
    assert out["changed"] and len(out["files_to_fetch"]) == 5 and out["bytes_fetched"] == 0
    assert not os.path.exists(dest)


def test_server_exits_after_idle_timeout(seed):
    s = Running(seed[0], idle=0.5)
    s.thread.join(10)
    assert not s.thread.is_alive()


# ----------------------------------------------------------------------------- page cache and failover

def resident_pages(path):
    """Pages of `path` in the page cache (mincore(2) over a mapping of the file)."""
    import ctypes
    import mmap
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    with open(path, "rb") as f:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        vec = ctypes.create_string_buffer(pages)
        assert libc.mincore(ctypes.c_void_p(addr), size, vec) == 0, ctypes.get_errno()
        libc.munmap(ctypes.c_void_p(addr), size)
    return sum(b & 1 for b in vec.raw)


@pytest.fixture
def big_seed(tmp_path):
    """One file of 24 pieces: more than the write-behind window."""
    from ansible_collections.npuops.ascend.tests.unit.plugins.module_utils.weights_helpers import safetensors
    root = str(tmp_path / "bigseed")
    os.makedirs(root)
    safetensors(os.path.join(root, "model-00001-of-00001.safetensors"), 24 * PIECE - 200, seed=None)
    m, _stats = manifest.build(root, piece_size=PIECE)
    manifest.save_json(weight_server.manifest_path(root), m)
    return root, m


def test_writeback_starts_per_piece_and_written_pages_are_dropped(big_seed, tmp_path, monkeypatch):
    """Through the page cache (a file system without O_DIRECT)."""
    root, m = big_seed
    monkeypatch.setattr(transfer, "open_direct", lambda path: None)
    rel = "model-00001-of-00001.safetensors"
    size = m["files"][rel]["size"]
    calls = []
    real_sfr, real_drop = transfer._SYNC_FILE_RANGE, transfer._fadvise_dontneed

    def sfr(fd, offset, length, flags):
        calls.append(("sync_file_range", offset, length, flags))
        return real_sfr(fd, offset, length, flags) if real_sfr else 0

    def drop(fd, offset, length):
        calls.append(("dontneed", offset, length))
        real_drop(fd, offset, length)

    monkeypatch.setattr(transfer, "_SYNC_FILE_RANGE", sfr)
    monkeypatch.setattr(transfer, "_fadvise_dontneed", drop)
    srv = Running(root)
    try:
        dest = str(tmp_path / "dest")
        transfer.sync([srv.url], TOKEN, dest, parallel=1)
    finally:
        srv.stop()
    pieces = len(m["files"][rel]["pieces"])
    started = [(o, n) for kind, o, n, *f in calls if kind == "sync_file_range" and f[0] == transfer.SYNC_FILE_RANGE_WRITE]
    assert started == [(i * PIECE, min(PIECE, size - i * PIECE)) for i in range(pieces)]  # every piece, as it landed
    waited = [o for kind, o, n, *f in calls if kind == "sync_file_range" and f[0] != transfer.SYNC_FILE_RANGE_WRITE]
    dropped = [o for kind, o, n in (c[:3] for c in calls if c[0] == "dontneed")]
    window = [i * PIECE for i in range(pieces - transfer.WRITEBACK_WINDOW)]
    assert waited == window and dropped[:-1] == window and dropped[-1] == 0  # then the whole file after fsync
    # the order is the point: a piece is waited for and dropped a window after its writeback started
    first_wait = next(i for i, c in enumerate(calls) if c[0] == "sync_file_range" and c[3] != 2)
    assert [c[1] for c in calls[:first_wait] if c[0] == "sync_file_range"] == [
        i * PIECE for i in range(transfer.WRITEBACK_WINDOW + 1)]
    if open("/proc/mounts").read().find(" %s tmpfs " % os.path.dirname(dest)) == -1:
        assert resident_pages(os.path.join(dest, rel)) <= 16  # on disk, not in memory


def test_a_copy_for_a_prewarm_keeps_its_pages(big_seed, tmp_path):
    root, m = big_seed
    rel = "model-00001-of-00001.safetensors"
    srv = Running(root)
    try:
        dropped = str(tmp_path / "dropped")
        kept = str(tmp_path / "kept")
        transfer.sync([srv.url], TOKEN, dropped)
        transfer.sync([srv.url], TOKEN, kept, keep_cache=True)
    finally:
        srv.stop()
    pages = (m["files"][rel]["size"] + 4095) // 4096
    assert resident_pages(os.path.join(kept, rel)) >= pages * 0.9
    assert resident_pages(os.path.join(dropped, rel)) <= pages * 0.1


class FrozenPeer(object):
    """What a SIGSTOPped server looks like from outside: the kernel completes every connection, nothing is
    ever answered. Counts the connections made to it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.accepted = []
        self.thread = threading.Thread(target=self.accept)
        self.thread.daemon = True
        self.thread.start()

    def accept(self):
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            self.answer(conn)

    def answer(self, conn):
        self.accepted.append(conn)  # held open, never read

    def close(self):
        self.sock.close()
        for c in self.accepted:
            c.close()


def test_a_frozen_peer_is_demoted_for_the_whole_copy_and_routed_around(seed, server, tmp_path):
    root, m = seed
    frozen = FrozenPeer()
    try:
        t0 = time.time()
        # with the full manifest given, the first request to the frozen peer is for data
        out = transfer.sync([frozen.url, server.url], TOKEN, str(tmp_path / "dest"), manifest=m, parallel=4,
                            peer_timeout=1)
        took = time.time() - t0
    finally:
        frozen.close()
    assert same_tree(root, str(tmp_path / "dest"), m) and out["files_fetched"] == 5
    assert [f["peer"] for f in out["peer_failures"]] == [frozen.url]
    assert "did not answer a ping" in out["peer_failures"][0]["reason"]
    # one stall for the whole copy (one silent second, one ping), not one per piece nor one per thread
    assert took < 1 + transfer.PING_TIMEOUT + 2.5, took
    data_requests = len(frozen.accepted)
    assert data_requests <= 4 + 1 + took / transfer.BACKOFF_FIRST, frozen.accepted  # 4 threads, a ping, probes


def test_a_peer_that_refuses_connections_is_routed_around(seed, server, tmp_path):
    root, m = seed
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))
    gone_url = "http://127.0.0.1:%d" % gone.getsockname()[1]
    gone.close()  # nothing listens: refused at once, as a node whose server is down
    out = transfer.sync([gone_url, server.url], TOKEN, str(tmp_path / "dest"), parallel=3)
    assert same_tree(root, str(tmp_path / "dest"), m)
    assert out["peer_failures"][0]["peer"] == gone_url and "cannot connect" in out["peer_failures"][0]["reason"]


def test_a_relay_whose_own_copy_ended_answers_at_once(seed, tmp_path):
    root, m = seed
    relay_dir = str(tmp_path / "relay")
    os.makedirs(os.path.join(relay_dir, ".npuops"))
    manifest.save_json(weight_server.manifest_path(relay_dir), m)
    rel = "model-00002-of-00003.safetensors"
    data = open(os.path.join(root, rel), "rb").read()
    with open(os.path.join(relay_dir, rel + ".part"), "wb") as f:
        f.write(data[:PIECE])
    write_record(os.path.join(relay_dir, rel), 1)
    manifest.save_json(weight_server.sync_progress_path(relay_dir), {"state": "failed", "updated": time.time()})
    relay = Running(relay_dir)
    try:
        conn = transfer.Connection("127.0.0.1", relay.srv.port)
        status, _h = conn.request("/files/" + rel, TOKEN, (0, PIECE - 1))
        assert status == 206 and conn.read_body() == data[:PIECE]  # what it has, it serves
        t0 = time.time()
        status, _h = conn.request("/files/" + rel, TOKEN, (PIECE, 2 * PIECE - 1))
        assert status == 503 and b"not running" in conn.read_body() and time.time() - t0 < 3
    finally:
        relay.stop()


def test_progress_records_are_checked_and_older_ones_still_read(tmp_path):
    rec = weight_server.encode_progress(7, 7 * PIECE + 5)
    assert len(rec) == weight_server.RECORD_BYTES and weight_server.decode_progress(rec) == (7, 7 * PIECE + 5)
    torn = weight_server.encode_progress(8, 8 * PIECE)[:20] + rec[20:]
    assert weight_server.decode_progress(torn) is None
    assert weight_server.decode_progress(b"12") == (12, None)  # the format of older versions
    final = str(tmp_path / "f")
    assert weight_server.read_progress(final) == (0, 0)


def test_the_progress_names_its_run_and_gives_no_eta_from_a_moment(tmp_path):
    now = [1000.0]
    p = transfer.Progress(str(tmp_path / "p.json"), "run-1", 3, 10 * 10 ** 9, clock=lambda: now[0])
    p.add(fetched=10 ** 6)
    now[0] += 0.5
    snap = p.snapshot()
    assert snap["run_id"] == "run-1" and snap["eta_s"] is None
    for _i in range(10):
        now[0] += 2
        p.add(fetched=400 * 10 ** 6, done_bytes=400 * 10 ** 6)
        p.sample()
    snap = p.snapshot()
    assert snap["mb_per_s"] == 200.0 and snap["eta_s"] == round((10e9 - 4e9) / 200e6)
    assert p.snapshot("failed")["eta_s"] is None


# ----------------------------------------------------------------------- CPU per byte: the write path, the stream

def written_by_path(monkeypatch):
    """Record every pwrite into a .part: (O_DIRECT or not, offset, length)."""
    import fcntl
    real = os.pwrite
    seen = []

    def pwrite(fd, data, offset):
        if os.readlink("/proc/self/fd/%d" % fd).endswith(".part"):
            seen.append((bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT), offset, len(data)))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    return seen


def test_a_copy_writes_with_o_direct_in_aligned_pieces_and_only_each_files_tail_through_the_cache(
        big_seed, seed, tmp_path, monkeypatch):
    for root, m in (big_seed, seed):
        calls = []
        monkeypatch.setattr(transfer, "_SYNC_FILE_RANGE", lambda *a: calls.append(a))
        seen = written_by_path(monkeypatch)
        srv = Running(root)
        try:
            dest = str(tmp_path / ("dest-" + os.path.basename(root)))
            transfer.sync([srv.url], TOKEN, dest, parallel=2)
        finally:
            srv.stop()
            monkeypatch.undo()
        assert same_tree(root, dest, m)
        direct = sum(n for d, _o, n in seen if d)
        cached = [(o, n) for d, o, n in seen if not d]
        tails = sum(e["size"] % transfer.DIRECT_ALIGN for e in m["files"].values())
        assert direct == manifest.total_bytes(m) - tails and sum(n for _o, n in cached) == tails
        assert all(not o % transfer.DIRECT_ALIGN and not n % transfer.DIRECT_ALIGN for d, o, n in seen if d)
        assert max(n for _d, _o, n in seen) <= transfer.CHUNK
        assert calls == []  # nothing dirty to write back: the disk took the bytes from the buffer


def test_one_request_per_file_and_every_piece_still_checked(seed, server, tmp_path, monkeypatch):
    root, m = seed
    paths = []
    real = transfer.Connection.request
    monkeypatch.setattr(transfer.Connection, "request", lambda self, path, *a, **k: paths.append(path) or
                        real(self, path, *a, **k))
    checked = []
    real_checked = transfer.PartFile.piece_checked
    monkeypatch.setattr(transfer.PartFile, "piece_checked",
                        lambda self, i: checked.append((os.path.basename(self.final), i)) or real_checked(self, i))
    transfer.sync([server.url], TOKEN, str(tmp_path / "dest"), manifest=m, parallel=1)
    assert sorted(p for p in paths if p.startswith("/files/")) == sorted("/files/" + r for r in m["files"])
    assert sorted(checked) == sorted((os.path.basename(r), i) for r, e in m["files"].items()
                                     for i in range(len(e["pieces"])))


def test_a_bad_piece_from_one_peer_comes_again_from_another_and_the_file_streams_on(seed, server, tmp_path):
    root, m = seed
    rel = "model-00002-of-00003.safetensors"
    bad_dir = str(tmp_path / "bad")
    os.makedirs(os.path.join(bad_dir, ".npuops"))
    manifest.save_json(weight_server.manifest_path(bad_dir), m)
    for r in m["files"]:
        os.makedirs(os.path.dirname(os.path.join(bad_dir, r)) or bad_dir, exist_ok=True)
        data = bytearray(open(os.path.join(root, r), "rb").read())
        if r == rel:
            data[2 * PIECE + 99] ^= 0x40  # piece 2 of 5 is corrupt on this peer
        open(os.path.join(bad_dir, r), "wb").write(bytes(data))
    bad = Running(bad_dir)
    try:
        out = transfer.sync([bad.url, server.url], TOKEN, str(tmp_path / "dest"), manifest=m, parallel=1)
    finally:
        bad.stop()
    assert same_tree(root, str(tmp_path / "dest"), m)
    assert out["bytes_fetched"] == manifest.total_bytes(m) + PIECE  # that piece twice, nothing else
    assert out["peer_failures"] == []  # a bad piece is not a failed peer


class BreakingPeer(FrozenPeer):
    """A server that answers its first range request with the right head and the first `cut` bytes of the body
    (from the seed's file), then closes, and every later one with a 503: a relay whose copy stopped at an odd
    byte."""

    def __init__(self, root, cut):
        self.root, self.cut = root, cut
        self.served = 0
        super(BreakingPeer, self).__init__()

    def answer(self, conn):
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(4096)
        if self.served:
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\n\r\nnot running\n")
            conn.close()
            return
        lines = head.decode().split("\r\n")
        rel = lines[0].split()[1][len("/files/"):]
        first, last = [int(x) for x in [h for h in lines if h.startswith("Range:")][0].split("=")[1].split("-")]
        with open(os.path.join(self.root, rel), "rb") as f:
            f.seek(first)
            body = f.read(min(self.cut, last + 1 - first))
        conn.sendall(("HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\n" % (last + 1 - first)).encode()
                     + body)
        self.served += len(body)
        conn.close()


def test_a_peer_that_stops_at_an_odd_byte_is_left_there_and_the_next_realigns(seed, server, tmp_path, monkeypatch):
    root, m = seed
    rel = "model-00002-of-00003.safetensors"
    one = {"files": {rel: m["files"][rel]}, "piece_size": m["piece_size"], "version": m["version"]}
    breaking = BreakingPeer(root, PIECE + 12345)
    seen = written_by_path(monkeypatch)
    try:
        out = transfer.sync([breaking.url, server.url], TOKEN, str(tmp_path / "dest"), manifest=one)
    finally:
        breaking.close()
        monkeypatch.undo()
    assert same_tree(root, str(tmp_path / "dest"), one)
    assert out["bytes_fetched"] == m["files"][rel]["size"] and breaking.served == PIECE + 12345
    # the next peer goes on from the odd byte: up to the next aligned one through the cache, then direct again
    odd = [(o, n) for d, o, n in seen if not d]
    assert odd[:2] == [(PIECE, 12345), (PIECE + 12345, transfer.DIRECT_ALIGN - 12345 % transfer.DIRECT_ALIGN)]
    assert all(d for d, o, n in seen if o >= PIECE + 16384 and o + n < m["files"][rel]["size"] - 4096)


def test_the_next_read_stops_at_the_piece_end_and_realigns_from_an_odd_byte(tmp_path):
    entry = {"size": 3 * PIECE + 10, "pieces": ["x"] * 4}
    part = transfer.PartFile(str(tmp_path / "f"), entry, PIECE)
    try:
        run = transfer.Run(part, "f", entry, 1, transfer.Progress(None, None, 1, entry["size"]))
        assert (run.index, run.pos) == (1, PIECE) and run.room(65536) == 65536
        assert run.room(transfer.CHUNK) == min(transfer.CHUNK, PIECE)
        run.pos = 2 * PIECE - 8192
        assert run.room(transfer.CHUNK) == 8192  # not past the piece's end
        run.pos = PIECE + 100
        assert run.room(transfer.CHUNK) == transfer.DIRECT_ALIGN - 100
        run._begin(3, attempt=1)
        assert run.room(transfer.CHUNK) == 10  # the file's tail
        entry["size"] = run.size = 3 * PIECE + 3 * transfer.DIRECT_ALIGN + 10
        part.size = entry["size"]
        run._begin(3, attempt=1)
        assert run.room(transfer.CHUNK) == 3 * transfer.DIRECT_ALIGN  # whole blocks, then the odd 10 bytes
    finally:
        part.abandon(remove=True)


def test_an_empty_file_is_checked_without_a_request(server, tmp_path):
    empty = {"size": 0, "sha256": manifest.hashlib.sha256(b"").hexdigest(), "pieces": [manifest.piece_digest(b"")]}
    m = {"version": 2, "piece_size": PIECE, "files": {"empty.bin": empty}}
    out = transfer.sync(["http://127.0.0.1:9"], TOKEN, str(tmp_path / "dest"), manifest=m)
    assert out["files_fetched"] == 1 and os.path.getsize(str(tmp_path / "dest" / "empty.bin")) == 0


def test_a_body_read_fills_the_buffer_with_what_came_with_the_head_and_the_rest(tmp_path):
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    body = os.urandom(3 * 65536)

    def answer():
        conn, _a = lsock.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:1000])
        time.sleep(0.2)  # the rest comes later, as from a relay
        conn.sendall(body[1000:])
        conn.close()

    t = threading.Thread(target=answer)
    t.start()
    c = transfer.Connection("127.0.0.1", lsock.getsockname()[1])
    c.request("/files/x", TOKEN, (0, len(body) - 1))
    buf = transfer.aligned_buffer(65536)
    assert c.readinto(buf) == 65536 and bytes(buf) == body[:65536]  # one whole, aligned chunk
    t.join(5)
    c.close()
    lsock.close()


def test_a_file_system_without_o_direct_is_written_through_the_cache(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *a):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", no_direct)
    assert transfer.open_direct(str(tmp_path / "x")) is None
    monkeypatch.undo()
    part = transfer.PartFile(str(tmp_path / "y"), {"size": 8192, "pieces": ["x"]}, PIECE)
    assert part.dfd is not None
    data = os.urandom(8192)  # a bytes object: not aligned in memory, O_DIRECT refuses it
    part.write(data, 0)
    part.write(memoryview(data)[:4096], 4096)
    part.abandon(remove=False)
    assert open(str(tmp_path / "y.part"), "rb").read() == data[:4096] + data[:4096]


def test_send_range_sends_the_range_and_gives_up_on_a_peer_that_stops_reading(tmp_path):
    path = str(tmp_path / "blob")
    data = os.urandom(1 << 20)
    open(path, "wb").write(data)
    a, b = socket.socketpair()
    a.settimeout(5)
    with open(path, "rb") as f:
        assert weight_server.send_range(a, f, 1000, 5000, 5) == 5000
    got = b""
    while len(got) < 5000:
        got += b.recv(5000 - len(got))
    assert got == data[1000:6000] and a.gettimeout() == 5  # the handler's timeout is back
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    t0 = time.time()
    with open(path, "rb") as f:
        sent = weight_server.send_range(a, f, 0, 1 << 20, 1)  # b reads nothing
    assert sent < 1 << 20 and time.time() - t0 < 3
    a.close()
    b.close()


def test_a_node_goes_back_to_the_node_before_it_once_that_one_has_the_file(seed, server, tmp_path, monkeypatch):
    """The chain: a receiver asks the node before it first; when that node's .part is not there yet it takes a
    piece from the next peer (the seed) and then goes back, so the seed does not feed every node."""
    root, m = seed
    relay_dir = str(tmp_path / "relay")
    shutil.copytree(root, relay_dir)
    relay = Running(relay_dir)
    asked = set()
    real_locate = relay.srv.locate

    def late(rel, entry):  # every file "not here yet" at the first request
        if rel not in asked:
            asked.add(rel)
            return None, "not here yet"
        return real_locate(rel, entry)

    relay.srv.locate = late
    by_peer = {}
    real_arrived = transfer.Run.arrived

    def arrived(self, data, peer):
        by_peer[peer.url] = by_peer.get(peer.url, 0) + len(data)
        return real_arrived(self, data, peer)

    monkeypatch.setattr(transfer.Run, "arrived", arrived)
    try:
        transfer.sync([relay.url, server.url], TOKEN, str(tmp_path / "dest"), manifest=m, parallel=1)
    finally:
        relay.stop()
    assert same_tree(root, str(tmp_path / "dest"), m)
    first_pieces = sum(min(e["size"], PIECE) for e in m["files"].values())
    assert by_peer[server.url] == first_pieces  # one piece per file from the seed, then the relay again
    assert by_peer[relay.url] == manifest.total_bytes(m) - first_pieces


def test_a_part_renamed_into_place_while_asked_for_is_served_under_its_final_name(seed, server):
    """The relay's copy finished the file between the server finding its .part and opening it."""
    root, m = seed
    rel = "config.json"
    real_locate = server.srv.locate
    raced = []

    def stale(r, entry):
        if not raced:
            raced.append(r)
            return os.path.join(server.srv.root, r) + ".part", False  # gone by the time it is opened
        return real_locate(r, entry)

    server.srv.locate = stale
    code, body = raw_get(server.url, "/files/" + rel)
    assert raced and code == 200 and body == open(os.path.join(root, rel), "rb").read()


def test_a_relay_waits_a_moment_for_a_file_its_running_copy_is_about_to_start(seed, tmp_path):
    root, m = seed
    rel = "model-00001-of-00003.safetensors"
    relay_dir = str(tmp_path / "relay")
    os.makedirs(os.path.join(relay_dir, ".npuops"))
    manifest.save_json(weight_server.manifest_path(relay_dir), m)
    manifest.save_json(weight_server.sync_progress_path(relay_dir), {"state": "running", "updated": time.time()})
    relay = Running(relay_dir)
    data = open(os.path.join(root, rel), "rb").read()

    def start_the_file():  # what the relay's copy does 0.5 s later: the file's .part, then its bytes
        time.sleep(0.5)
        with open(os.path.join(relay_dir, rel + ".part"), "wb") as f:
            f.write(data)
        with open(os.path.join(relay_dir, rel + weight_server.PROGRESS_SUFFIX), "wb") as f:
            f.write(weight_server.encode_progress(len(m["files"][rel]["pieces"]), len(data)))

    t = threading.Thread(target=start_the_file)
    t.start()
    try:
        t0 = time.time()
        code, body = raw_get(relay.url, "/files/" + rel)
        assert code == 200 and body == data and 0.4 < time.time() - t0 < weight_server.START_WAIT
        t.join(5)
        # a file the running copy does not start within START_WAIT: 503 then, and at once when no copy runs
        other = "model-00002-of-00003.safetensors"
        t0 = time.time()
        assert raw_get(relay.url, "/files/" + other)[0] == 503
        assert weight_server.START_WAIT <= time.time() - t0 < weight_server.START_WAIT + 2
        manifest.save_json(weight_server.sync_progress_path(relay_dir), {"state": "failed", "updated": time.time()})
        relay.srv._live = (0.0, False)
        t0 = time.time()
        assert raw_get(relay.url, "/files/" + other)[0] == 503 and time.time() - t0 < 1
    finally:
        relay.stop()
