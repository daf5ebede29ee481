# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What an image really holds, read on the node without starting the engine: its id and registry digest
(`<engine> image inspect`), and the versions of vllm, vllm_ascend, torch_npu and torch from their package metadata
plus CANN's from the toolkit's install info, read by a few lines of Python in a throw-away container of the image
(`run --rm --network none --entrypoint python3`; the vLLM-Ascend tutorial's own check is `pip show vllm
vllm-ascend`, and vllm-ascend's collect_env.py reads ascend_toolkit_install.info). The same container says which
Mooncake transfer engine the image carries (vllm-ascend's Dockerfile installs mooncake-transfer-engine-npu with pip)
and what a process in it preloads (LD_PRELOAD, /etc/ld.so.preload): what the engine's process would get.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ansible_collections.npuops.ascend.plugins.module_utils import proc

# Runs inside the image: only the standard library, no import of torch or vLLM (seconds, no device needed).
SCRIPT = r"""
import glob, json
from importlib import metadata
out = {}
for key, names in (("vllm", ("vllm",)), ("vllm_ascend", ("vllm_ascend", "vllm-ascend")),
                   ("torch_npu", ("torch_npu", "torch-npu")), ("torch", ("torch",)),
                   ("mooncake", ("mooncake-transfer-engine-npu", "mooncake-transfer-engine", "mooncake"))):
    out[key] = None
    for name in names:
        try:
            out[key] = metadata.version(name)
            break
        except metadata.PackageNotFoundError:
            pass
out["cann"] = None
for path in sorted(glob.glob("/usr/local/Ascend/ascend-toolkit/latest/*-linux/ascend_toolkit_install.info")):
    with open(path) as f:
        for line in f:
            if line.startswith("version="):
                out["cann"] = line.split("=", 1)[1].strip()
                break
import os
preload = {"env": os.environ.get("LD_PRELOAD") or None, "file": None}
try:
    with open("/etc/ld.so.preload") as f:
        preload["file"] = f.read().strip() or None
except OSError:
    pass
out["preload"] = preload
print(json.dumps(out))
"""
PACKAGES = ("vllm", "vllm_ascend", "torch_npu", "torch", "cann", "mooncake")


def inspect_argv(engine_name, image):
    return ["inspect", image] if engine_name == "isula" else ["image", "inspect", image]


def identity(info):
    """-> (id, registry digest or None) of an inspected image."""
    digests = info.get("RepoDigests") or []
    digest = None
    for d in digests:
        if "@" in d:
            digest = d.split("@", 1)[1]
            break
    return info.get("Id") or info.get("id"), digest


def parse_versions(text):
    """The script's output -> {package: version or None}; ValueError when it printed something else."""
    lines = [line for line in (text or "").splitlines() if line.strip().startswith("{")]
    if not lines:
        raise ValueError("no JSON in %r" % (text or "")[-300:])
    data = json.loads(lines[-1])
    return dict((k, data.get(k)) for k in PACKAGES)


def parse_preload(text):
    """What a process in the image preloads: {env: LD_PRELOAD, file: /etc/ld.so.preload} (None each when nothing)."""
    lines = [line for line in (text or "").splitlines() if line.strip().startswith("{")]
    data = json.loads(lines[-1]) if lines else {}
    preload = data.get("preload") or {}
    return {"env": preload.get("env"), "file": preload.get("file")}


def read(run, cli, image, timeout):
    """-> {image, present, id, digest, versions, error}. `run(argv, timeout) -> (rc, stdout, stderr)` (proc.run), `cli`
    the container CLI's path. Standard library only (the NPU exporter runs it on the nodes); each call bounded by
    `timeout`."""
    name = os.path.basename(cli)
    out = {"image": image, "present": False, "id": None, "digest": None, "versions": None, "preload": None,
           "error": None}
    argv = [cli] + inspect_argv(name, image)
    rc, stdout, stderr = run(argv, timeout)
    if rc == proc.TIMED_OUT:
        out["error"] = proc.describe(argv, timeout)
        return out
    if rc != 0:
        text = (stderr or stdout or "").strip()
        if "no such" in text.lower() or "not found" in text.lower() or "unknown" in text.lower():
            return out
        out["error"] = "%s image inspect %s: %s" % (name, image, text[-300:])
        return out
    try:
        data = json.loads(stdout)
    except ValueError:
        out["error"] = "%s image inspect %s printed no JSON: %s" % (name, image, (stdout or "").strip()[-300:])
        return out
    info = data[0] if isinstance(data, list) and data else data if isinstance(data, dict) else {}
    out["present"] = True
    out["id"], out["digest"] = identity(info)
    argv = [cli, "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", SCRIPT]
    rc, stdout, stderr = run(argv, timeout)
    if rc == proc.TIMED_OUT:
        out["error"] = proc.describe(argv[:8], timeout)
        return out
    if rc != 0:
        out["error"] = "reading the package versions in %s failed (rc %s): %s" % (
            image, rc, (stderr or stdout or "").strip()[-300:])
        return out
    try:
        out["versions"] = parse_versions(stdout)
        out["preload"] = parse_preload(stdout)
    except ValueError as e:
        out["error"] = "reading the package versions in %s: %s" % (image, e)
    return out
