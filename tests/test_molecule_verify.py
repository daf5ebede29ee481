"""The molecule verifier compares running containers with literal expectations from the tier document and the
inventory: it must catch a read-write mount, a wrong rank and a missing env value (it rebuilt nothing from the
planner, and no observed mount is forced to read-only)."""
import copy
import json
import os
import subprocess
import sys

import pytest

from npuops_sim.testing import REPO

VERIFY = os.path.join(REPO, "molecule", "_shared", "verify_containers.py")
TIER = os.path.join(REPO, "collections", "ansible_collections", "npuops", "ascend", "data", "tiers", "2node_pp.yml")
MOUNTS = ["/usr/local/dcmi", "/usr/local/Ascend/driver/tools/hccn_tool", "/usr/local/bin/npu-smi",
          "/usr/local/Ascend/driver/lib64", "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info",
          "/etc/hccn.conf", "/srv/models/k3"]


def container(ip, rank, leader_ip):
    # the field report's template (the 2node_pp tier's default recipe), as the container runs it
    argv = ["vllm", "serve", "/srv/models/k3", "--quantization", "ascend", "--trust-remote-code",
            "--tensor-parallel-size", "16", "--pipeline-parallel-size", "2", "--max-model-len", "210000",
            "--max-num-seqs", "64", "--max-num-batched-tokens", "8192", "--kv-cache-dtype", "int8", "--block-size",
            "768", "--gpu-memory-utilization", "0.9", "--enable-prefix-caching", "--enable-expert-parallel",
            "--tokenizer-mode", "kimi_k3", "--reasoning-parser", "kimi_k3", "--tool-call-parser", "kimi_k3",
            "--enable-auto-tool-choice", "--nnodes", "2", "--node-rank", str(rank), "--master-addr", leader_ip,
            "--master-port", "29500"]
    argv += ["--host", ip, "--port", "8000"] if rank == 0 else ["--headless"]
    env = ["HCCL_IF_IP=%s" % ip, "VLLM_HOST_IP=%s" % ip, "GLOO_SOCKET_IFNAME=eth9", "TP_SOCKET_IFNAME=eth9",
           "HCCL_SOCKET_IFNAME=eth9", "ASCEND_RT_VISIBLE_DEVICES=" + ",".join(str(i) for i in range(16))]
    devices = ["/dev/davinci%d" % i for i in range(16)] + ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
    return [{"Config": {"Cmd": argv, "Env": env, "Labels": {"io.npuops.group": "main",
                                                            "io.npuops.role": "leader" if rank == 0 else "worker"}},
             "HostConfig": {"Devices": [{"PathOnHost": d} for d in devices]},
             "Mounts": [{"Source": m, "Destination": m, "RW": False} for m in MOUNTS], "State": {"Running": True}}]


@pytest.fixture
def files(tmp_path):
    inv = {"npu_nodes": {"hosts": ["a", "b"]}, "_meta": {"hostvars": {
        h: {"npuops_node_ip": ip, "npuops_nic": "eth9", "npuops_model_dir": "/srv/models/k3"}
        for h, ip in (("a", "10.0.0.1"), ("b", "10.0.0.2"))}}}
    inspect = {"a": container("10.0.0.1", 0, "10.0.0.1"), "b": container("10.0.0.2", 1, "10.0.0.1")}
    return tmp_path, inv, inspect


def verify(tmp_path, inv, inspect):
    (tmp_path / "inv.json").write_text(json.dumps(inv))
    (tmp_path / "inspect.json").write_text(json.dumps(inspect))
    return subprocess.run([sys.executable, VERIFY, TIER, str(tmp_path / "inv.json"), str(tmp_path / "inspect.json")],
                          capture_output=True, text=True)


def test_matching_containers_pass(files):
    proc = verify(*files)
    assert proc.returncode == 0, proc.stdout
    assert "2 containers checked, 0 problem(s)" in proc.stdout


@pytest.mark.parametrize("spoil,expect", [
    (lambda i: i["b"][0]["Mounts"][6].update(RW=True), "b: the mounts (source, destination, read-write)"),
    (lambda i: i["b"][0]["Config"]["Cmd"].__setitem__(i["b"][0]["Config"]["Cmd"].index("--node-rank") + 1, "0"),
     "b: --node-rank is '0', the tier, recipe and inventory say '1'"),
    (lambda i: i["a"][0]["Config"]["Env"].remove("VLLM_HOST_IP=10.0.0.1"), "a: env VLLM_HOST_IP is None"),
    (lambda i: i["b"][0]["Config"]["Cmd"].__setitem__(i["b"][0]["Config"]["Cmd"].index("--kv-cache-dtype") + 1, "auto"),
     "b: --kv-cache-dtype is 'auto', the tier, recipe and inventory say 'int8'"),
    (lambda i: i["a"][0]["Mounts"].pop(), "a: the mounts"),
])
def test_a_spoiled_container_is_named(files, spoil, expect):
    tmp_path, inv, inspect = files
    inspect = copy.deepcopy(inspect)
    spoil(inspect)
    proc = verify(tmp_path, inv, inspect)
    assert proc.returncode == 1 and expect in proc.stdout, proc.stdout
