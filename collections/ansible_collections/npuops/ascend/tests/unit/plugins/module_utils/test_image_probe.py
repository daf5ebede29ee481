# -*- coding: utf-8 -*-
"""image_probe: an image's id, digest and versions, read through the container CLI (faked here: the argv is what a
real docker / podman gets; the script's output is what it prints in the image)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import subprocess
import sys

from ansible_collections.npuops.ascend.plugins.module_utils import image_probe, proc


def engine(answers):
    calls = []

    def run(argv, timeout):
        calls.append((argv, timeout))
        return answers[len(calls) - 1]
    return run, calls


def test_the_script_reads_package_metadata_and_the_cann_info_with_the_standard_library(tmp_path):
    """The script runs in the image's own python3: here in this one, against dist-info written for it."""
    for dist, version in (("vllm", "0.27.1"), ("vllm_ascend", "0.27.0rc1"), ("torch_npu", "2.10.0.post4")):
        d = tmp_path / ("%s-%s.dist-info" % (dist, version))
        d.mkdir()
        (d / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (dist.replace("_", "-"), version))
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n" % str(tmp_path) +
                          image_probe.SCRIPT], capture_output=True, text=True, timeout=60, check=True).stdout
    got = image_probe.parse_versions(out)
    assert (got["vllm"], got["vllm_ascend"], got["torch_npu"]) == ("0.27.1", "0.27.0rc1", "2.10.0.post4")
    assert set(got) == set(image_probe.PACKAGES)


def test_read_inspects_then_runs_the_script_without_network_or_entrypoint():
    inspect = json.dumps([{"Id": "abc", "RepoDigests": ["quay.io/ascend/vllm-ascend@sha256:" + "1" * 64]}])
    versions = json.dumps({"vllm": "0.23.0", "vllm_ascend": "0.23.0", "torch_npu": "x", "torch": "y", "cann": "9.1.0"})
    eng, calls = engine([(0, inspect, ""), (0, "some warning\n" + versions + "\n", "")])
    out = image_probe.read(eng, "/usr/bin/podman", "quay.io/ascend/vllm-ascend:kimi-k3-a3", 20)
    assert out["present"] and out["id"] == "abc" and out["digest"] == "sha256:" + "1" * 64
    assert out["versions"]["vllm"] == "0.23.0" and out["error"] is None
    assert calls[0][0] == ["/usr/bin/podman", "image", "inspect", "quay.io/ascend/vllm-ascend:kimi-k3-a3"]
    assert calls[1][0][:8] == ["/usr/bin/podman", "run", "--rm", "--network", "none", "--entrypoint", "python3",
                               "quay.io/ascend/vllm-ascend:kimi-k3-a3"]
    assert all(t == 20 for _argv, t in calls)


def test_an_image_not_pulled_yet_is_not_present_and_a_failed_run_is_an_error():
    eng, _calls = engine([(125, "", "Error: no such image: x")])
    absent = {"image": "x", "present": False, "id": None, "digest": None, "versions": None, "preload": None,
              "error": None}
    assert image_probe.read(eng, "/usr/bin/docker", "x", 5) == absent
    eng, _calls = engine([(0, json.dumps([{"Id": "i"}]), ""), (127, "", "exec: python3: not found")])
    out = image_probe.read(eng, "/usr/bin/docker", "x", 5)
    assert out["present"] and out["versions"] is None and "python3: not found" in out["error"]
    eng, calls = engine([(proc.TIMED_OUT, "", "")])
    assert image_probe.read(eng, "/usr/bin/isula", "x", 5)["error"] == "/usr/bin/isula inspect x did not answer within 5s"
    assert calls[0][0] == ["/usr/bin/isula", "inspect", "x"]


def test_the_script_reads_the_mooncake_wheel_and_what_a_process_preloads(tmp_path):
    """vllm-ascend's Dockerfile installs the transfer engine as mooncake-transfer-engine-npu; a process of the image
    preloads what LD_PRELOAD names (the image's ENV) and /etc/ld.so.preload lists (which the environment cannot
    clear)."""
    import os
    d = tmp_path / "mooncake_transfer_engine_npu-0.3.11.post1.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: mooncake-transfer-engine-npu\nVersion: 0.3.11.post1\n")
    env = dict(os.environ, LD_PRELOAD="/usr/lib64/libjemalloc.so.2")
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\n" % str(tmp_path) +
                          image_probe.SCRIPT], capture_output=True, text=True, timeout=60, check=True, env=env).stdout
    assert image_probe.parse_versions(out)["mooncake"] == "0.3.11.post1"
    preload = image_probe.parse_preload(out)
    assert preload["env"] == "/usr/lib64/libjemalloc.so.2"
    # this machine has no /etc/ld.so.preload (or what it lists): the script reads the file, whatever it holds
    expected = open("/etc/ld.so.preload").read().strip() or None if os.path.exists("/etc/ld.so.preload") else None
    assert preload["file"] == expected
