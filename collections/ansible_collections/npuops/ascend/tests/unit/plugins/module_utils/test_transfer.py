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
    leftovers = [f for _r, _d, fs in os.walk(dest) for f in fs if f.endswith((".part", ".progress"))]
    assert leftovers == []


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
