# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import os

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import manifest
from ansible_collections.npuops.ascend.tests.unit.plugins.module_utils.weights_helpers import model_dir, safetensors


def test_walk_lists_regular_files_only(tmp_path):
    root = model_dir(str(tmp_path / "m"))
    os.symlink("/etc/passwd", os.path.join(root, "passwd"))
    os.symlink("/etc", os.path.join(root, "etc"))
    open(os.path.join(root, "x.safetensors.part"), "w").close()
    os.makedirs(os.path.join(root, ".npuops"))
    open(os.path.join(root, ".npuops", "manifest.json"), "w").close()
    assert manifest.walk(root) == ["config.json", "model-00001-of-00003.safetensors",
                                   "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                   "tokenizer/tokenizer.model"]


def test_hash_file_gives_the_sha256_and_a_digest_per_piece(tmp_path):
    path = str(tmp_path / "f")
    data = os.urandom(2500)
    open(path, "wb").write(data)
    size, digest, pieces = manifest.hash_file(path, piece_size=1000)
    assert size == 2500 and digest == hashlib.sha256(data).hexdigest()
    assert pieces == [hashlib.sha256(data[i:i + 1000]).hexdigest()[:32] for i in (0, 1000, 2000)]
    open(path, "wb").write(data[:2000])
    assert len(manifest.hash_file(path, piece_size=1000)[2]) == 2
    open(path, "wb").close()
    assert manifest.hash_file(path) == (0, hashlib.sha256(b"").hexdigest(), [hashlib.sha256(b"").hexdigest()[:32]])


def test_summary_drops_the_piece_digests(tmp_path):
    root = model_dir(str(tmp_path / "m"))
    m, _stats = manifest.build(root, piece_size=1 << 20)
    s = manifest.summary(m)
    assert set(s["files"]) == set(m["files"]) and all(set(e) == {"size", "sha256"} for e in s["files"].values())


def test_build_reuses_entries_while_size_and_mtime_match(tmp_path):
    root = model_dir(str(tmp_path / "m"))
    first, stats = manifest.build(root, piece_size=1 << 20)
    assert stats["hashed"] == 5 and stats["reused"] == 0 and stats["safetensors_errors"] == {}
    assert manifest.total_bytes(first) == sum(os.path.getsize(os.path.join(root, r)) for r in manifest.walk(root))
    second, stats = manifest.build(root, previous=first, piece_size=1 << 20)
    assert stats["hashed"] == 0 and stats["reused"] == 5 and second == first
    with open(os.path.join(root, "config.json"), "a") as f:
        f.write(" ")
    third, stats = manifest.build(root, previous=second, piece_size=1 << 20)
    assert stats["hashed"] == 1 and third["files"]["config.json"]["sha256"] != first["files"]["config.json"]["sha256"]


def test_truncated_and_broken_safetensors_are_caught(tmp_path):
    good = str(tmp_path / "a.safetensors")
    safetensors(good, 4096)
    assert manifest.check_safetensors(good) is None
    with open(good, "r+b") as f:
        f.truncate(os.path.getsize(good) - 10)
    assert "truncated" in manifest.check_safetensors(good)
    bad = str(tmp_path / "b.safetensors")
    open(bad, "wb").write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    assert "not JSON" in manifest.check_safetensors(bad)
    open(bad, "wb").write(b"\xff" * 8)
    assert "does not fit" in manifest.check_safetensors(bad)
    _m, stats = manifest.build(str(tmp_path))
    assert sorted(stats["safetensors_errors"]) == ["a.safetensors", "b.safetensors"]


def test_publisher_comparison(tmp_path):
    root = model_dir(str(tmp_path / "m"))
    m, _stats = manifest.build(root)
    real = m["files"]["model-00001-of-00003.safetensors"]["sha256"]
    publisher = {"model-00001-of-00003.safetensors": real.upper(), "model-00002-of-00003.safetensors": "0" * 64,
                 "model-00009-of-00009.safetensors": {"sha256": "ab" * 32}, "README.md": None}
    assert manifest.compare_publisher(m, publisher) == [
        {"file": "model-00002-of-00003.safetensors", "ours": m["files"]["model-00002-of-00003.safetensors"]["sha256"],
         "theirs": "0" * 64},
        {"file": "model-00009-of-00009.safetensors", "ours": None, "theirs": "ab" * 32}]


def test_publisher_listings_of_both_hubs():
    hf = [{"type": "file", "oid": "9f2c", "size": 42, "path": "config.json"},
          {"type": "file", "oid": "1a2b", "size": 4, "path": "model-00001.safetensors",
           "lfs": {"oid": "aa" * 32, "size": 4, "pointerSize": 135}},
          {"type": "directory", "oid": "cc", "size": 0, "path": "tokenizer"}]
    assert manifest.publisher_listing("huggingface", hf) == {"model-00001.safetensors": "aa" * 32}
    ms = {"Code": 200, "Data": {"Files": [{"Path": "model-00001.safetensors", "Sha256": "bb" * 32, "Type": "blob"},
                                          {"Path": "tokenizer", "Type": "tree"}]}}
    assert manifest.publisher_listing("modelscope", ms) == {"model-00001.safetensors": "bb" * 32}
    with pytest.raises(manifest.ManifestError, match="unknown weights source"):
        manifest.publisher_listing("s3", {})


def test_download_commands_pin_the_revision():
    assert manifest.download_argv("modelscope", "moonshotai/Kimi-K3-W4A8", "v1.0", "/data/m") == [
        "modelscope", "download", "--model", "moonshotai/Kimi-K3-W4A8", "--revision", "v1.0", "--local_dir", "/data/m"]
    assert manifest.download_argv("huggingface", "moonshotai/Kimi-K3", "3f1e2d", "/data/m") == [
        "hf", "download", "moonshotai/Kimi-K3", "--revision", "3f1e2d", "--local-dir", "/data/m"]
    with pytest.raises(manifest.ManifestError, match="pin the revision"):
        manifest.download_argv("huggingface", "moonshotai/Kimi-K3", "", "/data/m")
    assert manifest.listing_url("huggingface", "a/b", "r1") == "https://huggingface.co/api/models/a/b/tree/r1?recursive=1"
    assert "Revision=r1" in manifest.listing_url("modelscope", "a/b", "r1")


def test_load_and_save_round_trip_and_reject_foreign_files(tmp_path):
    path = str(tmp_path / "d" / "manifest.json")
    data = {"version": manifest.VERSION, "piece_size": 4, "files": {}}
    manifest.save_json(path, data)
    assert manifest.load(path) == data
    assert manifest.load(str(tmp_path / "missing.json")) is None
    open(path, "w").write('{"files": []}')
    with pytest.raises(manifest.ManifestError, match="not an npuops manifest"):
        manifest.load(path)


def test_stray_files_and_shards_the_index_does_not_name(tmp_path):
    import json as _json
    from ansible_collections.npuops.ascend.plugins.module_utils import manifest as mf
    root = tmp_path / "m"
    (root / ".npuops").mkdir(parents=True)
    for name in ("a.safetensors", "b.safetensors", "extra.safetensors", "notes.txt", "x.safetensors.part"):
        (root / name).write_bytes(b"x")
    (root / ".npuops" / "manifest.json").write_text("{}")
    listed = {"a.safetensors": {}, "b.safetensors": {}}
    assert mf.stray_files(str(root), listed) == ["extra.safetensors", "notes.txt"]  # state and partials are ours
    assert mf.unindexed_shards(str(root)) == []  # no index: nothing to tell
    (root / mf.INDEX).write_text(_json.dumps({"weight_map": {"w1": "a.safetensors", "w2": "b.safetensors"}}))
    assert mf.unindexed_shards(str(root)) == ["extra.safetensors"]
    data, _stats = mf.build(str(root), exclude=["extra.safetensors"])
    assert "extra.safetensors" not in data["files"] and "a.safetensors" in data["files"]
