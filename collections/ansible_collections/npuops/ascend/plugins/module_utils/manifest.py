# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Weight manifests: what a model directory holds, with checksums, recorded once at the seed.

A manifest is ``{"version", "piece_size", "files": {relpath: {size, mtime_ns, sha256, pieces}}}``:
``sha256`` is the file's digest (what publishers list, checked against them on the seed), ``pieces`` the
sha256 (first 128 bits) of each ``piece_size`` slice. Every node checks every piece as it arrives, so it
can relay a piece while the rest of the file is still coming, and a file whose pieces all match is the
seed's file, byte for byte: each byte is hashed once per node. An entry is reused while the file's size
and mtime match, so recording it again costs a ``stat`` per file. Standard library only: runs on nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import os
import posixpath
import struct
import threading
import time

from ansible_collections.npuops.ascend.plugins.module_utils import workers
# where the manifest lives is defined once, by the self-contained server that must find it
from ansible_collections.npuops.ascend.plugins.module_utils.weight_server import PROGRESS_SUFFIX, STATE_DIR

VERSION = 2
PIECE_SIZE = 4 * 1024 * 1024
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
PARTIAL = (".part", PROGRESS_SUFFIX, PROGRESS_SUFFIX + ".tmp")


class ManifestError(Exception):
    pass


def directories(model_dir, tokenizer_dir=""):
    """[(part, path)] a node must hold: the model directory, and the tokenizer directory (vLLM's --tokenizer) when it
    is neither that directory nor inside it."""
    model = posixpath.normpath(model_dir)
    out = [("model", model)]
    if tokenizer_dir:
        tokenizer = posixpath.normpath(tokenizer_dir)
        if tokenizer != model and not tokenizer.startswith(model.rstrip("/") + "/"):
            out.append(("tokenizer", tokenizer))
    return out


def walk(root):
    """Relative paths of the regular files under root, sorted; skips our state dir, partial copies (and
    their progress records, also those older versions left) and anything that is a symlink (a symlink could
    point outside the model directory)."""
    out = []
    root = os.path.abspath(root)
    for base, dirs, files in os.walk(root, followlinks=False):
        rel_base = os.path.relpath(base, root)
        dirs[:] = sorted(d for d in dirs if not (rel_base == "." and d == STATE_DIR) and
                         not os.path.islink(os.path.join(base, d)))
        for name in sorted(files):
            full = os.path.join(base, name)
            if name.endswith(PARTIAL) or os.path.islink(full) or not os.path.isfile(full):
                continue
            out.append(os.path.normpath(os.path.join(rel_base, name)) if rel_base != "." else name)
    return out


def stray_files(root, manifest_files):
    """Files of the model directory that the manifest does not list (an extra shard, a text file): an engine that
    loads every *.safetensors of the directory would load them too. -> sorted relative paths."""
    return [rel for rel in walk(root) if rel not in manifest_files] if os.path.isdir(root) else []


INDEX = "model.safetensors.index.json"


def unindexed_shards(root):
    """The seed's *.safetensors that its checkpoint index (model.safetensors.index.json, weight_map) does not
    name: not part of the checkpoint. [] when there is no index to tell."""
    try:
        with open(os.path.join(root, INDEX)) as f:
            named = set((json.load(f).get("weight_map") or {}).values())
    except (IOError, OSError, ValueError, AttributeError):
        return []
    return [rel for rel in walk(root) if rel.endswith(".safetensors") and rel not in named]


def piece_digest(data):
    """The digest a manifest records for a piece: sha256, first 128 bits, hex."""
    return hashlib.sha256(data).hexdigest()[:32]


def hash_file(path, piece_size=PIECE_SIZE):
    """-> (size, sha256 hex of the file, [piece digests]) in one read pass."""
    sha = hashlib.sha256()
    pieces = []
    size = 0
    buf = bytearray(piece_size)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            got = 0
            while got < piece_size:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
            if not got and pieces:
                break
            data = view[:got]
            sha.update(data)
            pieces.append(piece_digest(data))
            size += got
            if got < piece_size:
                break
    return size, sha.hexdigest(), pieces


def file_sha256(path, chunk=PIECE_SIZE):
    """The sha256 of a whole file (no piece digests: half the hashing of hash_file)."""
    sha = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            data = f.read(chunk)
            if not data:
                return sha.hexdigest()
            sha.update(data)


def summary(manifest):
    """The manifest without piece digests: what the controller needs to plan (small for 1.5 TB)."""
    return {"version": manifest["version"], "piece_size": manifest["piece_size"],
            "files": dict((r, {"size": e["size"], "sha256": e["sha256"]}) for r, e in manifest["files"].items())}


def check_safetensors(path, size=None):
    """Structural check of a .safetensors file: 8-byte little-endian header length, a JSON header, and
    tensor offsets that end exactly at the end of the file (a truncated copy fails this instantly)."""
    size = os.path.getsize(path) if size is None else size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "%d bytes: too short for a safetensors header" % size
        (n,) = struct.unpack("<Q", head)
        if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
            return "header length %d does not fit in a %d-byte file" % (n, size)
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            return "header is not JSON (%s)" % e
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            return "tensor %s has no data_offsets" % name
        if not 0 <= begin <= stop:
            return "tensor %s has offsets %s" % (name, info["data_offsets"])
        end = max(end, stop)
    if 8 + n + end != size:
        return "header says the file holds %d bytes, it has %d (truncated or padded)" % (8 + n + end, size)
    return None


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (IOError, OSError):
        return None
    except ValueError as e:
        raise ManifestError("%s is not valid JSON: %s" % (path, e))
    if not isinstance(data, dict) or data.get("version") != VERSION or "files" not in data:
        raise ManifestError("%s is not an npuops manifest (version %s)" % (path, VERSION))
    return data


def save_json(path, data, durable=True):
    """Write JSON whole or not at all (temporary file, then rename): a reader never sees half of it.

    `durable` fsyncs before the rename; state that is cheap to rebuild (caches, progress) skips it."""
    d = os.path.dirname(path)
    if d and not os.path.isdir(d):
        os.makedirs(d)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True, separators=(",", ":"))
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.rename(tmp, path)


def build(root, previous=None, piece_size=PIECE_SIZE, parallel=4, exclude=()):
    """Manifest of `root` (but `exclude`), re-hashing only files whose (size, mtime) changed since `previous`.

    -> (manifest, stats) with stats {hashed, reused, bytes_hashed, seconds, safetensors_errors}.
    """
    t0 = time.time()
    old = (previous or {}).get("files", {}) if (previous or {}).get("piece_size") == piece_size else {}
    entries = {}
    todo = []
    errors = {}
    for rel in walk(root):
        if rel in exclude:
            continue
        st = os.stat(os.path.join(root, rel))
        prior = old.get(rel)
        if prior and prior.get("size") == st.st_size and prior.get("mtime_ns") == st.st_mtime_ns:
            entries[rel] = prior
        else:
            todo.append((rel, st))
    lock = threading.Lock()
    failures = []

    def hash_one(item):
        rel, st = item
        full = os.path.join(root, rel)
        try:
            if rel.endswith(".safetensors"):
                problem = check_safetensors(full, st.st_size)
                if problem:
                    with lock:
                        errors[rel] = problem
            size, digest, pieces = hash_file(full, piece_size)
        except (IOError, OSError) as e:
            with lock:
                failures.append("%s: %s" % (rel, e))
            return
        with lock:
            entries[rel] = {"size": size, "mtime_ns": st.st_mtime_ns, "sha256": digest, "pieces": pieces}

    workers.for_each(todo, hash_one, parallel)
    if failures:
        raise ManifestError("could not read: %s" % "; ".join(failures[:5]))
    # safetensors headers of reused entries are checked again: cheap, and it catches a file truncated in place
    for rel in entries:
        if rel.endswith(".safetensors") and rel not in errors:
            problem = check_safetensors(os.path.join(root, rel))
            if problem:
                errors[rel] = problem
    manifest = {"version": VERSION, "piece_size": piece_size, "files": dict(sorted(entries.items()))}
    stats = {"hashed": len(todo), "reused": len(entries) - len(todo),
             "bytes_hashed": sum(st.st_size for _rel, st in todo), "seconds": round(time.time() - t0, 3),
             "safetensors_errors": errors}
    return manifest, stats


def total_bytes(manifest):
    return sum(e["size"] for e in manifest["files"].values())


def compare_publisher(manifest, publisher):
    """Files whose sha256 differs from the publisher's list, or that it lists and we lack.

    `publisher`: {relpath: sha256} or {relpath: {"sha256": ...}} (ModelScope / Hugging Face per-file
    digests, or a converted msprechecker dump). -> [{file, ours, theirs}]
    """
    out = []
    for rel, want in sorted(publisher.items()):
        theirs = want.get("sha256") if isinstance(want, dict) else want
        if not theirs:
            continue
        ours = manifest["files"].get(rel, {}).get("sha256")
        if ours != str(theirs).lower():
            out.append({"file": rel, "ours": ours, "theirs": str(theirs).lower()})
    return out


def publisher_listing(source, listing):
    """The publisher's per-file sha256 from its API listing -> {relpath: sha256}.

    huggingface: /api/models/<repo>/tree/<revision>?recursive=1 (a list; LFS files carry lfs.oid = sha256).
    modelscope: /api/v1/models/<repo>/repo/files?Revision=<rev>&Recursive=true (Data.Files[].Sha256).
    Files the publisher gives no sha256 for (small non-LFS files on Hugging Face) are left out.
    """
    out = {}
    if source == "huggingface":
        for item in listing or []:
            lfs = item.get("lfs") or {}
            if item.get("type") == "file" and lfs.get("oid"):
                out[item["path"]] = lfs["oid"]
    elif source == "modelscope":
        for item in ((listing or {}).get("Data") or {}).get("Files") or []:
            if item.get("Type") == "blob" and item.get("Sha256"):
                out[item["Path"]] = item["Sha256"]
    else:
        raise ManifestError("unknown weights source %r (modelscope or huggingface)" % source)
    return out


def download_argv(source, repo, revision, dest):
    """The vendor CLI that downloads `repo` at a pinned `revision` into `dest`."""
    if not revision:
        raise ManifestError("pin the revision (a commit id or tag) of %s: a moving branch cannot be verified" % repo)
    if source == "huggingface":
        return ["hf", "download", repo, "--revision", revision, "--local-dir", dest]
    if source == "modelscope":
        return ["modelscope", "download", "--model", repo, "--revision", revision, "--local_dir", dest]
    raise ManifestError("unknown weights source %r (modelscope or huggingface)" % source)


HUBS = {
    # endpoint, and the environment variables the vendor's CLI/SDK reads the token and a mirror endpoint from
    "huggingface": {"endpoint": "https://huggingface.co", "token_env": "HF_TOKEN", "endpoint_env": "HF_ENDPOINT"},
    "modelscope": {"endpoint": "https://modelscope.cn", "token_env": "MODELSCOPE_API_TOKEN",
                   "endpoint_env": "MODELSCOPE_DOMAIN"},
}


def _hub(source):
    if source not in HUBS:
        raise ManifestError("unknown weights source %r (modelscope or huggingface)" % source)
    return HUBS[source]


def listing_url(source, repo, revision, endpoint=""):
    """The publisher's per-file listing at `revision`, at its own endpoint or at a mirror's."""
    base = (endpoint or _hub(source)["endpoint"]).rstrip("/")
    if source == "huggingface":
        return "%s/api/models/%s/tree/%s?recursive=1" % (base, repo, revision)
    return "%s/api/v1/models/%s/repo/files?Revision=%s&Recursive=true" % (base, repo, revision)


def hub_env(source, token="", endpoint=""):
    """{variable: value} for the download CLI: the token of a gated repository and a mirror endpoint.
    ModelScope's variable takes a host name, not a URL."""
    hub = _hub(source)
    env = {}
    if token:
        env[hub["token_env"]] = token
    if endpoint:
        env[hub["endpoint_env"]] = endpoint.split("://", 1)[-1].rstrip("/") if source == "modelscope" else endpoint
    return env
