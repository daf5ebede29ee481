"""The simulated engine and PD proxy run as plain processes on loopback, for the conformance tests.

No namespaces, no containers, no root: the files the image would hold are written into a temporary root (the
same image_files() the image is built from), the node's /dev, hccn.conf, shm and profile come through the
engine's NPUOPS_SIM_* overrides, and npu-smi is the simulator's own, rendered from a one-node A3 profile. Each
process emulates the vLLM / vllm-ascend versions an image tag claims (image.emulated), as its container would.
Every process is started by this module, tracked by PID and stopped by `close()`; every wait is bounded.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from . import image, plan, profile, weights
from .node_tools import npu_smi as npu_smi_tool

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_tools")
PROXY = "/vllm-workspace/vllm-ascend/examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(url, body, key=None, timeout=60):
    """POST a JSON body -> (status, raw body), whatever the status."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def sse_events(raw):
    """The JSON events of a streamed body (no [DONE])."""
    return [json.loads(line[6:]) for line in raw.decode().splitlines()
            if line.startswith("data: ") and line[6:] != "[DONE]"]


class Process(object):
    def __init__(self, proc, url, log):
        self.proc, self.url, self.log = proc, url, log

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()


class Loopback(object):
    """A temporary 'node' for engines and proxies on 127.0.0.1."""

    def __init__(self, root):
        self.root = str(root)
        self.procs = []
        self.image_root = os.path.join(self.root, "image")
        for path, (mode, data) in image.image_files().items():
            dest = os.path.join(self.image_root, path.lstrip("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(data)
            os.chmod(dest, mode)
        p = profile.build(plan.nodes(1, "a3")[0], "a3", plan.AddressPlan())
        self.profile = os.path.join(self.root, "profile.json")
        with open(self.profile, "w") as f:
            json.dump(p, f)
        smi = os.path.join(self.root, "npu_smi")
        for rel, text in npu_smi_tool.render_all(p).items():
            os.makedirs(os.path.dirname(os.path.join(smi, rel)), exist_ok=True)
            with open(os.path.join(smi, rel), "w") as f:
                f.write(text)
        self.dev = os.path.join(self.root, "dev")
        os.makedirs(self.dev)
        for name in ["davinci%d" % i for i in range(16)] + ["davinci_manager", "devmm_svm", "hisi_hdc"]:
            open(os.path.join(self.dev, name), "w").close()
        self.bin = os.path.join(self.root, "bin")
        os.makedirs(self.bin)
        with open(os.path.join(self.bin, "npu-smi"), "w") as f:
            f.write("#!/bin/sh\nexec /bin/sh %s \"$@\"\n" % os.path.join(TOOLS, "npu_smi.sh"))
        os.chmod(os.path.join(self.bin, "npu-smi"), 0o755)
        self.hccn_conf = os.path.join(self.root, "hccn.conf")
        with open(self.hccn_conf, "w") as f:
            f.write("address_0=10.0.0.1\nnetmask_0=255.255.255.0\n")
        self.shm = os.path.join(self.root, "shm")
        os.makedirs(self.shm)
        self.model = os.path.join(self.root, "models", "kimi-k3")
        weights.write_model(self.model, 1 << 20, files=2)
        self.env = dict(os.environ, PATH=self.bin + ":" + os.environ.get("PATH", ""), NPUOPS_SIM_DEV=self.dev,
                        NPUOPS_SIM_DEVMGR=self.dev + "/davinci_manager", NPUOPS_SIM_NPU_SMI=smi,
                        NPUOPS_SIM_PROFILE=self.profile, NPUOPS_SIM_HCCN_CONF=self.hccn_conf,
                        NPUOPS_SIM_SHM=self.shm, NPUOPS_SIM_TPOT="0.001",
                        PYTHONPATH=os.path.join(self.image_root, "opt", "npuops-sim"), PYTHONUNBUFFERED="1")
        for var in ("HCCL_IF_IP", "VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME",
                    "ASCEND_RT_VISIBLE_DEVICES", "OPENAI_API_KEY", "VLLM_API_KEY"):
            self.env.pop(var, None)

    def _start(self, argv, tag, env, name):
        log = os.path.join(self.root, "%s-%d.log" % (name, len(self.procs)))
        full = dict(self.env, **image.emulated(tag))
        full.update(env or {})
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, env=full, stdout=out, stderr=subprocess.STDOUT, cwd=self.root,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def vllm(self, args, tag="main-a3", env=None, name="vllm"):
        """`vllm <args>` of the stand-in, to completion (bounded): -> CompletedProcess."""
        code = "import sys; from npuops_vllm_sim.main import main; sys.exit(main(sys.argv[1:]))"
        full = dict(self.env, **image.emulated(tag))
        full.update(env or {})
        return subprocess.run([sys.executable, "-c", code] + list(args), env=full, cwd=self.root, text=True,
                              capture_output=True, timeout=300)

    def engine(self, *flags, tag="main-a3", env=None, served="kimi-k3", ready=True):
        """`vllm serve` of the stand-in on a free loopback port; waits for /health 200 when `ready`. `served`: a name or
        a list of them (--served-model-name)."""
        port = free_port()
        code = "import sys; from npuops_vllm_sim.main import main; sys.exit(main(sys.argv[1:]))"
        names = [served] if isinstance(served, str) else list(served)
        argv = [sys.executable, "-c", code, "serve", self.model, "--served-model-name"] + names + [
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "32768"] + list(flags)
        proc, log = self._start(argv, tag, env, "engine")
        p = Process(proc, "http://127.0.0.1:%d" % port, log)
        if ready:
            self.wait(p, "/health")
        return p

    def proxy(self, prefill, decode, tag="main-a3", env=None):
        """The stand-in PD proxy in front of engine Processes."""
        port = free_port()
        argv = [sys.executable, os.path.join(self.image_root, PROXY.lstrip("/")), "--host", "127.0.0.1",
                "--port", str(port), "--prefiller-hosts"] + ["127.0.0.1"] * len(prefill) + ["--prefiller-ports"]
        argv += [e.url.rsplit(":", 1)[1] for e in prefill] + ["--decoder-hosts"] + ["127.0.0.1"] * len(decode)
        argv += ["--decoder-ports"] + [e.url.rsplit(":", 1)[1] for e in decode]
        proc, log = self._start(argv, tag, env, "proxy")
        p = Process(proc, "http://127.0.0.1:%d" % port, log)
        self.wait(p, "/healthcheck")
        return p

    def wait(self, p, path, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if p.proc.poll() is not None:
                raise RuntimeError("%s exited (rc=%s):\n%s" % (p.url, p.proc.returncode, p.output()[-3000:]))
            try:
                with urllib.request.urlopen(p.url + path, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError("%s%s did not answer within %ds:\n%s" % (p.url, path, timeout, p.output()[-3000:]))

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
