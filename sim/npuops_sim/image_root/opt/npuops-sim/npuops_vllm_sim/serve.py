"""`vllm serve` of the stand-in: checks, rendezvous of the ranks, the OpenAI-compatible API, metrics."""
import glob
import json
import os
import queue
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import model as lm
from . import versions

VISIBLE = "ASCEND_RT_VISIBLE_DEVICES"
HCCN_CONF = os.environ.get("NPUOPS_SIM_HCCN_CONF", "/etc/hccn.conf")
SHM = os.environ.get("NPUOPS_SIM_SHM", "/dev/shm")
DEV = os.environ.get("NPUOPS_SIM_DEV", "/dev")
MIN_SHM = 1 << 30


def log(level, msg):
    sys.stdout.write("%s %s [npuops-sim] %s\n" % (level, time.strftime("%m-%d %H:%M:%S"), msg))
    sys.stdout.flush()


def die(msg, code=1):
    log("ERROR", msg)
    sys.stdout.flush()
    os._exit(code)


# ----------------------------------------------------------------------------------------- checks

def local_addresses():
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], stdout=subprocess.PIPE, text=True).stdout
    nics = {}
    for line in out.splitlines():
        parts = line.split()
        nics.setdefault(parts[1], []).append(parts[3].split("/")[0])
    return nics


def npu_map():
    """logic id -> physical id from npu-smi info -m (mounted from the host, as vLLM-Ascend containers have it)."""
    try:
        out = subprocess.run(["npu-smi", "info", "-m"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        die("RuntimeError: Failed to infer device type: npu-smi is not available in the container (%s); mount "
            "/usr/local/bin/npu-smi and the driver" % e)
    if "dcmi module initialize failed" in out:
        die("RuntimeError: Failed to infer device type: npu-smi: %s (are /dev/davinci_manager and the driver "
            "mounted?)" % out.strip())
    # A3: NPU ID, Chip ID, Chip Logic ID, Chip Phy-ID, Chip Name; A2 has no Phy-ID column (the logical id is the
    # physical one) and its chip name has a space ("Ascend 910B3")
    lines = [r for r in out.splitlines() if r.strip()]
    with_phy = bool(lines) and "Phy-ID" in lines[0]
    rows = [r.split() for r in lines[1:] if "Mcu" not in r]
    return dict((int(r[2]), int(r[3]) if with_phy else int(r[2])) for r in rows
                if len(r) >= 4 and r[2].isdigit() and (not with_phy or r[3].isdigit()))


def check_devices(local_world):
    visible = os.environ.get(VISIBLE)
    ids = [int(x) for x in visible.split(",") if x.strip()] if visible else None
    if ids is None:
        ids = sorted(int(re.sub(r"\D", "", os.path.basename(p))) for p in glob.glob(os.path.join(DEV, "davinci[0-9]*")))
    if len(ids) < local_world:
        die("ValueError: this node runs %d NPU workers (tensor x pipeline x local data parallel) but only %d NPUs "
            "are visible (%s=%s)" % (local_world, len(ids), VISIBLE, visible))
    mapping = npu_map()
    for logic in ids[:local_world]:
        phy = mapping.get(logic)
        if phy is None:
            die("RuntimeError: NPU %d is not known to npu-smi on this node" % logic)
        if not os.path.exists(os.path.join(DEV, "davinci%d" % phy)):
            die("RuntimeError: call aclrtSetDevice failed, ret=507033: /dev/davinci%d (NPU %d) is not in the "
                "container; pass it with --device" % (phy, logic))
    for dev in ("davinci_manager", "devmm_svm", "hisi_hdc"):
        if not os.path.exists(os.path.join(DEV, dev)):
            die("RuntimeError: drvInit failed: /dev/%s is not in the container" % dev)


def check_shm(local_world):
    try:
        st = os.statvfs(SHM)
        size = st.f_blocks * st.f_frsize
    except OSError:
        size = 0
    if local_world > 1 and size < MIN_SHM:
        time.sleep(3)  # vLLM waits 60 s for a broadcast block before giving up
        die("No available shared memory broadcast block found in 60 seconds. This typically happens when some "
            "processes are hanging or doing some time-consuming work (/dev/shm is %d MB)" % (size >> 20))


def check_preload():
    """A jemalloc preload (LD_PRELOAD, /etc/ld.so.preload) on a line that refuses it: "The current Kimi K3
    configuration on Atlas 800 A3 with vLLM-Ascend v0.27.1rc does not support LD_PRELOAD=/usr/lib64/libjemalloc.so.2"
    (vllm-ascend #17155). Upstream published no log of the failure; the stand-in crashes the way a process does
    (SIGSEGV, exit 139), which is what the closest public report shows (a segfault of Kimi-K3 on 0.27.x on A3, #16773,
    cause not established)."""
    if not versions.line().get("refuses_jemalloc"):
        return
    where = []
    if "jemalloc" in os.environ.get("LD_PRELOAD", ""):
        where.append("LD_PRELOAD=%s" % os.environ["LD_PRELOAD"])
    try:
        with open("/etc/ld.so.preload") as f:
            text = f.read()
        if "jemalloc" in text:
            where.append("/etc/ld.so.preload")
    except OSError:
        pass
    if where:
        log("INFO", "preloaded: %s" % ", ".join(where))
        sys.stderr.write("Fatal Python error: Segmentation fault\n\nCurrent thread (most recent call first):\n"
                         "  <no Python frame>\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)


def check_network():
    """HCCL_IF_IP / VLLM_HOST_IP must belong to this node, on the NIC *_SOCKET_IFNAME names."""
    nics = local_addresses()
    mine = set(a for addrs in nics.values() for a in addrs)
    for var in ("HCCL_IF_IP", "VLLM_HOST_IP"):
        ip = os.environ.get(var)
        if ip and ip not in mine:
            die("RuntimeError: [Gloo] %s=%s is not an address of this node (addresses: %s); connectFullMesh failed"
                % (var, ip, ", ".join(sorted(mine))))
    for var in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME"):
        nic = os.environ.get(var)
        if nic and nic not in nics:
            die("RuntimeError: [enforce fail at gloo] Unable to find interface for: [%s] (%s)" % (nic, var))
        ip = os.environ.get("HCCL_IF_IP")
        if nic and ip and ip not in nics.get(nic, []):
            die("RuntimeError: [Gloo] %s=%s does not own HCCL_IF_IP=%s; connectFullMesh failed" % (var, nic, ip))


HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
HCCL_DEVICE_PORT = 16666  # the port HCCL's device NICs listen on for the links between ranks
# CANN's EI0006 (error code reference, "Getting socket times out") as torch_npu raises it from createHCCLComm
EI0006 = ("EI0006: [PID: %d] %s Getting socket times out. Reason: 1. The remote does not initiate a connect request. "
          "some NPUs in the cluster are abnormal. 2. The remote does not initiate a connect request because the "
          "collective communication operator is started too late or is not started by some NPU in the cluster. 3. The "
          "communication link is disconnected. (For example, the IP addresses are not on the same network segment or "
          "the TLS configurations are inconsistent.)")


# CANN's EI0002 (error code reference, "The wait execution of the Notify register times out"): a collective waited
# longer than HCCL_EXEC_TIMEOUT for a rank
EI0002 = ("EI0002: [PID: %d] %s The wait execution of the Notify register times out. Reason: The Notify register has "
          "not received the Notify record from remote rank [%s]. Possible Cause: 1. An exception occurs during the "
          "execution on some NPUs in the cluster. As a result, collective communication operation failed. 2. The "
          "execution speed on some NPU in the cluster is too slow to complete a communication operation within the "
          "timeout interval. (default 1800s, You can set the interval by using HCCL_EXEC_TIMEOUT.)")


def exec_timeout(remote):
    die("RuntimeError: ACL stream synchronize failed.\n" + EI0002 % (
        os.getpid(), time.strftime("%Y-%m-%d-%H:%M:%S"), remote))


def hccl_facts(local_world):
    """What HCCL reads of this node's devices when it builds a communicator across nodes: each device's link and TLS
    switch (hccn_tool) and its IP (/etc/hccn.conf)."""
    facts = {"links": {}, "tls": {}, "ips": []}
    ips = {}
    try:
        with open(HCCN_CONF) as f:
            for line in f:
                m = re.match(r"\s*address_(\d+)\s*=\s*(\S+)", line)
                if m:
                    ips[int(m.group(1))] = m.group(2)
    except OSError:
        pass
    mapping = npu_map()
    visible = os.environ.get(VISIBLE)
    logic = [int(x) for x in visible.split(",") if x.strip()] if visible else list(range(local_world))
    for phy in [mapping.get(i, i) for i in logic[:local_world]]:
        for item, key in (("link", "links"), ("tls", "tls")):
            try:
                out = subprocess.run([HCCN_TOOL, "-i", str(phy), "-" + item, "-g"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            m = re.search(r"link status\s*:\s*(\S+)" if item == "link" else r"tls switch\[(\d+)\]", out)
            if m:
                facts[key][str(phy)] = m.group(1)
        if phy in ips:
            facts["ips"].append(ips[phy])
    return facts


def reachable(ip, timeout=1.0):
    """A device IP answers on the fabric (a refused connection is an answer; a prohibited route or silence is not)."""
    try:
        socket.create_connection((ip, HCCL_DEVICE_PORT), timeout=timeout).close()
        return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def unreachable_among(ips):
    """The device IPs that do not answer, all tried at once (each bounded by reachable()'s timeout)."""
    found = {}

    def one(ip):
        found[ip] = reachable(ip)
    threads = [threading.Thread(target=one, args=(ip,), daemon=True) for ip in ips]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    return [ip for ip in ips if not found.get(ip, False)]


def mesh_targets(facts_by_peer):
    """{peer: the other peers' first device IPs}: what each rank's node tries before the group's communicator is built
    (an all-to-all over EP reaches every pair of nodes, the leader's and the others')."""
    ips = dict((p, f["ips"][0]) for p, f in facts_by_peer.items() if f.get("ips"))
    return dict((p, sorted(ip for q, ip in ips.items() if q != p)) for p in ips if len(ips) > 1)


def hccl_problems(facts_by_peer, mesh=None):
    """What keeps the ranks of a group from building their communicator: a device link down, TLS switches that differ,
    a device IP some node cannot reach (`mesh`: {peer: [IPs it could not reach]}). -> [text]."""
    problems = []
    for peer, facts in sorted(facts_by_peer.items()):
        down = sorted(int(d) for d, state in (facts.get("links") or {}).items() if state != "UP")
        if down:
            problems.append("the device NIC of NPU %s on %s is down" % (",".join(map(str, down)), peer))
    switches = set(v for facts in facts_by_peer.values() for v in (facts.get("tls") or {}).values())
    if len(switches) > 1:
        problems.append("the devices' TLS switches differ")
    for peer, unreachable in sorted((mesh or {}).items()):
        problems.extend("%s cannot reach the device IP %s" % (peer, ip) for ip in unreachable)
    return problems


def hccl_fail_later(problems, rank):
    """The ranks wait for each other until HCCL_CONNECT_TIMEOUT (CANN's default 120 s), then torch_npu raises EI0006."""
    timeout = float(os.environ.get("HCCL_CONNECT_TIMEOUT", "120"))

    def fail():
        time.sleep(timeout)
        # what broke (`problems`) is not in the log, as on real servers: diagnose must tell it from the nodes' facts
        log("ERROR", "[HCCL] (RankID:%s) topo exchange with the group's other ranks did not complete within "
            "HCCL_CONNECT_TIMEOUT=%ds" % (rank, timeout))
        die("RuntimeError: createHCCLComm: HCCL function error: HcclCommInitRootInfoConfig(numRanks, &rootInfo, rank, "
            "config, &(comm->hcclComm_)), error code is 7\n" + EI0006 % (os.getpid(), time.strftime("%Y-%m-%d-%H:%M:%S")))
    threading.Thread(target=fail, daemon=True).start()


def check_parsers(args):
    """validate_api_server_args (vllm/entrypoints/openai/api_server.py): parser names are checked against the
    registries of this vLLM when the API server is set up, not by argparse."""
    caps = versions.vllm()
    if args.enable_auto_tool_choice and args.tool_call_parser not in caps["tool_call_parsers"]:
        die("KeyError: 'invalid tool call parser: %s (chose from { %s })'"
            % (args.tool_call_parser, ",".join(caps["tool_call_parsers"])))
    if args.reasoning_parser and args.reasoning_parser not in caps["reasoning_parsers"]:
        die("KeyError: 'invalid reasoning parser: %s (chose from { %s })'"
            % (args.reasoning_parser, ",".join(caps["reasoning_parsers"])))


def check_weights(path):
    """The checkpoint's files, checked before the ranks meet (what vLLM reads first: config.json, the headers)."""
    if not os.path.isdir(path):
        die("OSError: %s does not exist (is the model directory mounted into the container?)" % path)
    if not os.path.exists(os.path.join(path, "config.json")):
        die("OSError: %s does not appear to have a file named config.json" % path)
    shards = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not shards:
        die("RuntimeError: no *.safetensors weights found in %s" % path)
    total = 0
    for shard in shards:
        with open(shard, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 1 << 62
            if n > 100 << 20:
                die("safetensors_rust.SafetensorError: Error while deserializing header: %s" % shard)
            try:
                json.loads(f.read(n))
            except ValueError:
                die("safetensors_rust.SafetensorError: invalid header in %s" % shard)
        total += os.path.getsize(shard)
    return total, len(shards)


# SpeculativeConfig's fields (vllm/config/speculative.py) the Kimi-K3 tutorial's section 5.2 and vLLM-Ascend's pages
# set, and the methods vLLM plus vllm-ascend know (vllm_ascend/spec_decode/__init__.py adds dflash and dspark)
SPECULATIVE_FIELDS = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size", "max_model_len",
                      "draft_sample_method", "enforce_eager", "quantization", "revision", "code_revision",
                      "disable_padded_drafter_batch", "prompt_lookup_max", "prompt_lookup_min", "speculative_token_tree")
SPECULATIVE_METHODS = ("ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "deepseek_mtp", "mtp",
                       "dflash", "dspark")


def check_speculative(args, tp):
    """--speculative-config as vLLM's SpeculativeConfig checks it (vllm/config/speculative.py: a pydantic dataclass
    that forbids unknown fields; __post_init__ and _verify_args: k > 0; _verify_and_get_draft_tp: draft TP 1 or the
    target's; _maybe_override_draft_max_model_len: not longer than the target), then vllm-ascend's attention metadata
    builder (vllm_ascend/attention/mla_v1.py: decode_threshold = 1 + k <= 16). The draft checkpoint is read like the
    model's. -> the config (None without one)."""
    cfg = args.speculative_config
    if not cfg:
        return None
    for key in sorted(cfg):
        if key not in SPECULATIVE_FIELDS:
            die("pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n%s\n  "
                "Unexpected keyword argument [type=unexpected_keyword_argument, input_value=%r, input_type=%s]"
                % (key, cfg[key], type(cfg[key]).__name__))
    method = cfg.get("method")
    if method not in SPECULATIVE_METHODS:
        die("pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\nmethod\n  Input "
            "should be %s [type=literal_error, input_value=%r, input_type=str]"
            % (", ".join("'%s'" % m for m in SPECULATIVE_METHODS), method))
    k = cfg.get("num_speculative_tokens")
    if k is None:
        die("ValueError: num_speculative_tokens must be provided with speculative model unless the draft model config "
            "contains an n_predict parameter.")
    if not isinstance(k, int) or k <= 0:
        die("ValueError: Expected num_speculative_tokens to be greater than zero (%s)." % k)
    draft_tp = cfg.get("draft_tensor_parallel_size", tp)
    if draft_tp not in (1, tp):
        die("ValueError: speculative_draft_tensor_parallel_size=%s cannot be other value than 1 or target model "
            "tensor_parallel_size" % draft_tp)
    length = cfg.get("max_model_len")
    if length is not None and length > args.max_model_len:
        die("ValueError: speculative_max_model_len=%d cannot be larger than target_max_model_len=%d"
            % (length, args.max_model_len))
    if method != "ngram":
        check_weights(cfg.get("model") or "")
    if 1 + k > 16:
        die("AssertionError: decode_threshold exceeded                 npu_fused_infer_attention_score TND layout's "
            "limit of 16,                 got %d" % (1 + k))
    log("INFO", "speculative decoding: method %s, draft %s, %d speculative tokens, draft TP %d"
        % (method, cfg.get("model"), k, draft_tp))
    return cfg


# KV bytes per token per die of Kimi-K3's int8 MLA cache (61 layers x 576), to put the cache in vLLM's GiB
KV_BYTES_PER_TOKEN = 61 * 576


def check_kv_cache(args):
    """check_enough_kv_cache_memory (vllm/v1/core/kv_cache_utils.py): one sequence of max_model_len must fit the KV
    cache, or the engine refuses to start."""
    cap = lm.kv_tokens()
    if args.max_model_len > cap:
        gib = float(1 << 30)
        die("ValueError: To serve at least one request with the models's max seq len (%d), (%.2f GiB KV cache is "
            "needed, which is larger than the available KV cache memory (%.2f GiB). Based on the available memory, "
            "the estimated maximum model length is %d. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine." % (args.max_model_len, args.max_model_len *
                                                               KV_BYTES_PER_TOKEN / gib, cap * KV_BYTES_PER_TOKEN / gib,
                                                               cap))


def connectors(kv):
    """The connectors of a kv_transfer_config: MultiConnector's list (kv_connector_extra_config.connectors, vLLM's
    multi_connector.py), else the one."""
    if not kv:
        return []
    if kv.get("kv_connector") == "MultiConnector":
        return list((kv.get("kv_connector_extra_config") or {}).get("connectors") or [])
    return [kv]


def memcache_store(connector):
    """AscendStoreConnector with the memcache backend: MemcacheBackend._setup_store (vllm-ascend releases/v0.23.0,
    kv_pool/ascend_store/backend/memcache_backend.py) - DistributedObjectStore().init(), then `assert res == 0`."""
    backend = (connector.get("kv_connector_extra_config") or {}).get("backend", "mooncake")
    if backend != "memcache":
        die("ValueError: the stand-in's AscendStoreConnector has the memcache backend only, got %r" % backend)
    try:
        from memcache_hybrid import DistributedObjectStore
    except ImportError:
        die("ImportError: Please install memcache by following the instructions at "
            "https://gitee.com/ascend/memfabric_hybrid to run vLLM with MemcacheConnector.")
    try:
        res = DistributedObjectStore().init(0, init_bm=True)
    except ValueError as e:
        log("ERROR", "Configuration loading failed. error=%s. Check memcache config and environment." % e)
        die("ValueError: %s" % e)
    if res != 0:
        die("AssertionError (memcache_backend.py _setup_store: assert res == 0; DistributedObjectStore.init "
            "returned %d)" % res)
    log("INFO", "AscendStoreConnector: memcache store initialized")


def mooncake_sizes(kv):
    """MooncakeConnectorWorker._get_prefill_decode_size and its __init__ (vllm-ascend releases/v0.23.0,
    vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py): both sides' tp_size and dp_size must be in
    kv_connector_extra_config (bare asserts), and prefill TP below decode TP is refused."""
    for c in connectors(kv):
        if c.get("kv_connector") != "MooncakeConnectorV1":
            continue
        extra = c.get("kv_connector_extra_config") or {}
        for side in ("prefill", "decode"):
            for key in ("tp_size", "dp_size"):
                if key not in (extra.get(side) or {}):
                    die("AssertionError (mooncake_connector.py _get_prefill_decode_size: assert %r in %s_parallel_config)"
                        % (key, side))
        if extra["prefill"]["tp_size"] < extra["decode"]["tp_size"]:
            die("ValueError: prefill_tp_size: %s must be greater than or equal to the decode_tp_size: %s"
                % (extra["prefill"]["tp_size"], extra["decode"]["tp_size"]))


def load_weights(total, shards):
    # NPUOPS_SIM_LOAD_SECONDS (test infrastructure, given through the engine's environment) stretches the load
    # to what a 1.5 TB checkpoint takes, so tests can act while the engines load
    time.sleep(float(os.environ.get("NPUOPS_SIM_LOAD_SECONDS") or min(3.0, total / 20e9)))
    log("INFO", "Loading weights took %.2f GB from %d shards" % (total / 1e9, shards))


# ----------------------------------------------------------------------------------------- ranks

class Member(object):
    """A rank that joined the leader: its connection, and the answers to the steps the leader sent it."""

    def __init__(self, f, peer, ranks):
        self.f = f
        self.peer = peer
        self.ranks = ranks
        self.answers = queue.Queue()
        self.lock = threading.Lock()

    def send(self, msg):
        with self.lock:
            self.f.write(json.dumps(msg) + "\n")
            self.f.flush()


class Group(object):
    """The leader side of a rendezvous: ranks that joined over TCP, refused on mismatch or duplicates.

    Every request is a step every rank takes part in (vLLM's DP ranks step in lockstep, and an MoE layer's
    all-to-all spans every EP rank), so one frozen or lost rank stalls its whole group until HCCL's execution
    timeout, as on real clusters: the API still answers /health, but no token comes out."""

    def __init__(self, kind, expected, signature):
        self.kind = kind  # "node" (multinode) or "dp"
        self.expected = set(expected)
        self.signature = signature
        self.joined = {}
        self.lock = threading.Lock()
        self.complete = threading.Event()
        self.members = []
        self.broken = []  # peers that joined without /etc/hccn.conf
        self.hccl = {}  # peer -> hccl_facts() it sent; the leader's own under its address
        self.mesh = queue.Queue()  # (member, [device IPs it could not reach]) answers to a mesh check
        self.address = None
        self.step_lock = threading.Lock()
        self.steps = 0
        if not self.expected:
            self.complete.set()

    def step(self, exclude=None):
        """One step with every member but `exclude`; blocks while one of them does not answer (HCCL's execution
        timeout, HCCL_EXEC_TIMEOUT, then ends the engine as a real collective timeout does)."""
        timeout = float(os.environ.get("HCCL_EXEC_TIMEOUT", "1836"))
        with self.step_lock:
            self.steps += 1
            n = self.steps
            members = [m for m in self.members if m is not exclude]
            for m in members:
                try:
                    m.send({"step": n})
                except OSError:
                    pass
            for m in members:
                try:
                    m.answers.get(timeout=timeout)
                except queue.Empty:
                    exec_timeout("%s at %s" % (",".join(str(r) for r in m.ranks), m.peer))

    def listen(self, address, port):
        self.address = address
        try:
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind((address, port))
            srv.listen(64)
        except OSError as e:
            die("zmq.error.ZMQError: %s (addr='tcp://%s:%d')" % (e.strerror or e, address, port))
        t = threading.Thread(target=self.accept, args=(srv,))
        t.daemon = True
        t.start()
        log("INFO", "%s rendezvous listening on %s:%d, waiting for %s" % (
            "Master" if self.kind == "node" else "DP coordinator", address, port, sorted(self.expected)))

    def accept(self, srv):
        while True:
            conn, peer = srv.accept()
            threading.Thread(target=self.handle, args=(conn, peer[0]), daemon=True).start()

    def handle(self, conn, peer):
        f = conn.makefile("rw")
        try:
            hello = json.loads(f.readline())
        except ValueError:
            conn.close()
            return
        ranks = hello.get("ranks", [])
        err, last = None, False
        for key, value in self.signature.items():
            if hello.get("signature", {}).get(key) != value:
                err = "%s differs: the leader has %r, %s sent %r" % (key, value, peer,
                                                                      hello.get("signature", {}).get(key))
                break
        with self.lock:
            if err is None:
                for r in ranks:
                    if r in self.joined:
                        err = "%s rank %d is already taken by %s" % ("node" if self.kind == "node" else "DP", r,
                                                                     self.joined[r])
                        break
                    if r not in self.expected:
                        err = "%s rank %d is not one this group waits for (%s)" % (self.kind, r, sorted(self.expected))
                        break
            if err is None:
                for r in ranks:
                    self.joined[r] = peer
                if hello.get("hccn_conf") is False:
                    self.broken.append(peer)
                member = Member(f, peer, ranks)
                self.members.append(member)
                log("INFO", "%s rank(s) %s joined from %s (%d/%d)" % (self.kind, ranks, peer, len(self.joined),
                                                                      len(self.expected)))
                if hello.get("hccl"):
                    self.hccl[peer] = hello["hccl"]
                last = set(self.joined) == self.expected
        if err:
            log("ERROR", "refusing %s: %s" % (peer, err))
            f.write(json.dumps({"error": err}) + "\n")
            f.flush()
            conn.close()
            return
        member.send({"ok": True, "complete": self.complete.is_set(), "hccl_error": None})
        if last:  # after its answer: the member reads that first
            threading.Thread(target=self.build, daemon=True).start()
        # a member answers the steps the leader sends, asks for steps of its own (an external-DP rank serving a
        # request), and going away is an engine core that died: vLLM's leader fails with it
        while True:
            try:
                line = f.readline()
            except OSError:
                line = ""
            if not line:
                break
            msg = json.loads(line)
            if "mesh_result" in msg:
                self.mesh.put((peer, msg["mesh_result"]))
            elif "step" in msg:
                member.answers.put(msg)
            elif "sync" in msg:
                threading.Thread(target=self.sync_for, args=(member, msg["sync"]), daemon=True).start()
        with self.lock:
            gone = [r for r in ranks if self.joined.get(r) == peer]
        if gone:
            die("EngineDeadError: %s rank(s) %s at %s went away" % (self.kind, gone, peer))


    def build(self):
        """Every rank has joined: build the communicator as HCCL does - every node tries the others' devices (the
        members when the leader asks, the leader meanwhile; bounded), then the group completes or every rank fails
        as HCCL would."""
        targets = mesh_targets(self.hccl)
        for m in self.members:
            if m.peer in targets:
                try:
                    m.send({"mesh": targets[m.peer]})
                except OSError:
                    pass
        mesh = {self.address: unreachable_among(targets.get(self.address, []))}
        waiting, deadline = set(targets) - {self.address}, time.time() + 10
        while waiting and time.time() < deadline:
            try:
                peer, unreachable = self.mesh.get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                break
            mesh[peer] = unreachable
            waiting.discard(peer)
        problems = hccl_problems(self.hccl, mesh) if self.hccl else []
        if problems:
            hccl_fail_later(problems, 0)
        else:
            self.complete.set()
        for m in self.members:
            try:
                m.send({"hccl_error": problems, "rank": m.ranks[0]} if problems else {"complete": True})
            except OSError:
                pass

    def sync_for(self, member, n):
        self.step(exclude=member)
        try:
            member.send({"synced": n})
        except OSError:
            pass


def join(address, port, ranks, signature, timeout, hccn_conf=True, hccl=None):
    """The member side: dial the leader until it answers (or the engine-ready timeout passes)."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            conn = socket.create_connection((address, port), timeout=5)
            break
        except OSError as e:
            last = e
            time.sleep(1)
    else:
        die("RuntimeError: Did not receive response from front-end process within %d minutes (dialing %s:%d: %s)"
            % (max(1, timeout // 60), address, port, last))
    conn.settimeout(None)
    f = conn.makefile("rw")
    f.write(json.dumps({"ranks": ranks, "signature": signature, "hccn_conf": hccn_conf, "hccl": hccl}) + "\n")
    f.flush()
    answer = json.loads(f.readline() or "{}")
    if answer.get("error"):
        die("RuntimeError: the leader at %s:%d refused this engine: %s" % (address, port, answer["error"]))
    log("INFO", "joined the leader at %s:%d as rank(s) %s" % (address, port, ranks))
    if answer.get("hccl_error"):  # the group completed with this rank, and cannot build its communicator
        hccl_fail_later(answer["hccl_error"], answer.get("rank"))
    return conn, f, answer.get("complete", False)


class Follower(object):
    """The member side after the rendezvous: answers the leader's steps, asks the leader for a step of the whole
    group when this rank serves a request itself, and dies when the leader goes away."""

    def __init__(self, conn, f, complete):
        self.f = f
        self.complete = complete
        self.lock = threading.Lock()
        self.waiting = {}
        self.n = 0
        threading.Thread(target=self.watch, daemon=True).start()

    def send(self, msg):
        with self.lock:
            self.f.write(json.dumps(msg) + "\n")
            self.f.flush()

    def watch(self):
        while True:
            line = self.f.readline()
            if not line:
                die("EngineDeadError: the leader closed the connection")
            msg = json.loads(line)
            if "mesh" in msg:  # the leader asks before it builds the communicator: which of these answer?
                threading.Thread(target=lambda ips: self.send({"mesh_result": unreachable_among(ips)}),
                                 args=(msg["mesh"],), daemon=True).start()
            if msg.get("hccl_error"):
                hccl_fail_later(msg["hccl_error"], msg.get("rank"))
            if msg.get("complete"):
                self.complete.set()
            if "step" in msg:
                if lm.wedged():
                    # a collective hung on this node's NPUs: this rank never finishes the step, so the whole group
                    # stalls (the leader's API still answers /health, no token comes out) until HCCL's execution
                    # timeout ends it, as a rank that hangs in an HCCL task does (vllm-ascend #16646)
                    continue
                self.send({"step": msg["step"]})
            if "synced" in msg:
                event = self.waiting.pop(msg["synced"], None)
                if event:
                    event.set()

    def step(self):
        timeout = float(os.environ.get("HCCL_EXEC_TIMEOUT", "1836"))
        with self.lock:
            self.n += 1
            n = self.n
            event = self.waiting[n] = threading.Event()
        self.send({"sync": n})
        if not event.wait(timeout):
            exec_timeout("the group's other ranks")


def follow(conn, f, complete):
    return Follower(conn, f, complete)


# ----------------------------------------------------------------------------------------- serve

def run(args):
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    model_path = args.model_tag or args.model
    if not model_path:
        die("vllm serve: error: the model is required")
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    dp = args.data_parallel_size
    dp_local = args.data_parallel_size_local or (1 if args.data_parallel_address else dp)
    # every --served-model-name is accepted in requests, the first answers (vllm/entrypoints/openai/serving_models.py:
    # is_base_model matches any, model_name() is base_model_paths[0].name, /v1/models lists them all)
    served = list(args.served_model_name or [model_path])
    kv = args.kv_transfer_config or {}
    log("INFO", "vLLM-Ascend stand-in (vLLM %s) serving %s (tp=%d pp=%d dp=%d nnodes=%d)" % (
        versions.vllm_version(), model_path, tp, pp, dp, args.nnodes))

    # vLLM's own argument rules
    if args.headless and args.api_server_count > 1:
        die("ValueError: api_server_count can't be set in headless mode", 2)
    if args.nnodes > 1:
        if (tp * pp) % args.nnodes:
            die("ValueError: tensor_parallel_size x pipeline_parallel_size = %d must be divisible by nnodes = %d"
                % (tp * pp, args.nnodes))
        if not 0 <= args.node_rank < args.nnodes:
            die("ValueError: node_rank %d out of range for nnodes %d" % (args.node_rank, args.nnodes))
        if args.node_rank > 0 and not args.headless:
            die("ValueError: node_rank > 0 needs --headless (only the first node serves the API)")
        local_world = tp * pp // args.nnodes
    else:
        if dp % dp_local:
            die("ValueError: data_parallel_size %d is not a multiple of data_parallel_size_local %d" % (dp, dp_local))
        local_world = tp * pp * dp_local
    mooncake_sizes(kv)
    if pp > 1 and dp > 1:
        die("NotImplementedError: pipeline parallelism together with data parallelism across nodes is not "
            "supported for MoE over RoCE (MoeDistributeDispatch)")
    if args.data_parallel_rank is not None and args.data_parallel_start_rank is not None:
        die("ValueError: --data-parallel-rank and --data-parallel-start-rank exclude each other")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        die("TypeError: --enable-auto-tool-choice requires --tool-call-parser to be set")
    for c in connectors(kv):
        if c.get("kv_connector") not in ("MooncakeConnectorV1", "MooncakeLayerwiseConnector", "AscendStoreConnector"):
            die("ValueError: unknown kv_connector %r" % c.get("kv_connector"))
        if c.get("kv_role") not in ("kv_producer", "kv_consumer", "kv_both"):
            die("ValueError: unknown kv_role %r" % c.get("kv_role"))
        if c.get("kv_role") == "kv_consumer" and pp != 1:
            die("ValueError: MooncakeConnectorV1 requires decode pipeline_parallel_size = 1")
    if kv and not [c for c in connectors(kv) if c.get("kv_connector", "").startswith("Mooncake")]:
        die("ValueError: the stand-in moves KV between prefill and decode with a Mooncake connector only")

    if not args.headless:
        check_parsers(args)
    check_preload()
    check_network()
    check_devices(local_world)
    multi_node = args.nnodes > 1 or dp > dp_local or bool(kv)
    garbage = False
    if multi_node and not os.path.exists(HCCN_CONF):
        log("WARNING", "[HCCL] 'device ip' is not set correctly, must be set when multi Server or HCCL INTRA ROCE "
                       "ENABLE enabled (%s is missing)" % HCCN_CONF)
        garbage = True
    check_shm(local_world)
    weights = check_weights(model_path)
    spec_config = check_speculative(args, tp)
    check_kv_cache(args)
    if args.tokenizer and not os.path.isdir(args.tokenizer):
        # transformers' AutoTokenizer on a missing local directory (vllm/transformers_utils/tokenizer.py)
        die("OSError: Can't load tokenizer for '%s'. If you were trying to load it from 'https://huggingface.co/"
            "models', make sure you don't have a local directory with the same name." % args.tokenizer)

    signature = {"model": os.path.basename(model_path.rstrip("/")), "tp": tp, "pp": pp, "dp": dp,
                 "nnodes": args.nnodes, "kv_role": kv.get("kv_role")}
    ready_timeout = int(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))
    complete = threading.Event()
    group = None
    follower = None
    host_ip = os.environ.get("VLLM_HOST_IP") or args.host or "0.0.0.0"
    facts = hccl_facts(local_world) if multi_node and not garbage else None
    if args.nnodes > 1:
        if args.node_rank == 0:
            group = Group("node", range(1, args.nnodes), signature)
            group.listen(args.master_addr, args.master_port)
            if facts:
                group.hccl[args.master_addr] = facts
            complete = group.complete
        else:
            conn, f, done = join(args.master_addr, args.master_port, [args.node_rank], signature, ready_timeout,
                                 not garbage, facts)
            if done:
                complete.set()
            follower = follow(conn, f, complete)
    elif dp > 1:
        start = args.data_parallel_rank if args.data_parallel_rank is not None else \
            (args.data_parallel_start_rank or 0)
        ranks = list(range(start, start + dp_local))
        if not args.data_parallel_address:
            die("ValueError: --data-parallel-size > --data-parallel-size-local needs --data-parallel-address")
        leader = args.data_parallel_address in set(a for addrs in local_addresses().values() for a in addrs) \
            and start == 0
        if leader:
            group = Group("dp", set(range(dp)) - set(ranks), signature)
            group.listen(args.data_parallel_address, args.data_parallel_rpc_port)
            if facts:
                group.hccl[args.data_parallel_address] = facts
            complete = group.complete
        else:
            if start == 0 and args.data_parallel_address:
                die("RuntimeError: DP rank 0 must run on --data-parallel-address %s, which is not an address of "
                    "this node" % args.data_parallel_address)
            conn, f, done = join(args.data_parallel_address, args.data_parallel_rpc_port, ranks, signature,
                                 ready_timeout, not garbage, facts)
            if done:
                complete.set()
            follower = follow(conn, f, complete)
    else:
        complete.set()

    # the ranks have met (or are dialling in the background); each engine now loads its weights, and the API
    # answers only when they are loaded
    load_weights(*weights)
    engine = lm.Engine(served, model_path, args, garbage=garbage, dp_ranks=dp if args.data_parallel_rank is None
                       else 1, complete=complete, speculative=spec_config)
    if group is not None:
        engine.broken_peers = group.broken
        engine.step = group.step
    elif follower is not None:
        engine.step = follower.step
    if kv:
        # the KV pool's store comes up after the weights are loaded (kv_pool.md: "vLLM loads the model weights
        # before the KV connector initializes MemCache")
        for c in connectors(kv):
            if c.get("kv_connector") == "AscendStoreConnector":
                memcache_store(c)
        mooncake = [c for c in connectors(kv) if c.get("kv_connector", "").startswith("Mooncake")][0]
        dp_rank = args.data_parallel_rank or 0
        engine.kv = lm.KvConnector(dict(mooncake, engine_id=kv.get("engine_id") or mooncake.get("engine_id")),
                                   host_ip, int(mooncake.get("kv_port", 14579)) + dp_rank * tp * pp)
        engine.kv.start()
    if args.headless:
        log("INFO", "headless engine: no API server on this node")
        while True:
            time.sleep(3600)
    api_key = args.api_key or os.environ.get("VLLM_API_KEY")
    srv = ApiServer((args.host or "0.0.0.0", args.port), handler(engine, api_key))
    log("INFO", "Starting vLLM API server on http://%s:%d" % (args.host or "0.0.0.0", args.port))
    srv.serve_forever()
    return 0


class ApiServer(ThreadingHTTPServer):
    """Accepts connections as vLLM's API server does: vLLM binds the socket (create_server_socket in
    vllm/entrypoints/openai/api_server.py) and uvicorn listens on it with its Config.backlog, 2048
    (uvicorn/server.py loop.create_server(sock=..., backlog=config.backlog)); Python's default of 5 would refuse a
    burst of connections a real engine takes."""
    request_queue_size = 2048
    daemon_threads = True


# uvicorn closes a keep-alive connection that stays idle this long after a response (Config.timeout_keep_alive)
KEEP_ALIVE_S = 5.0


def handler(engine, api_key):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle(self):
            # one request, then the next ones on the same connection while it is kept alive; waiting for the next
            # one is bounded by uvicorn's keep-alive timeout, handling one is not
            self.close_connection = True
            self.handle_one_request()
            while not self.close_connection:
                self.connection.settimeout(KEEP_ALIVE_S)
                self.handle_one_request()

        def parse_request(self):
            self.connection.settimeout(None)  # a request has come: no idle timeout while it is read and answered
            return BaseHTTPRequestHandler.parse_request(self)

        def log_error(self, fmt, *a):
            if fmt.startswith("Request timed out"):
                return  # an idle keep-alive connection closed: uvicorn does it without a word
            BaseHTTPRequestHandler.log_error(self, fmt, *a)

        def log_message(self, fmt, *a):
            log("INFO", "%s - \"%s\" %s" % (self.client_address[0], self.requestline, a[1] if len(a) > 1 else ""))

        def send(self, code, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self):
            """The request body, always read, so the connection stays usable for the next request."""
            if getattr(self, "_body", None) is None:
                self._body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            return self._body

        def authorized(self):
            # vLLM's API-key middleware (vllm/entrypoints/serve/utils/server_utils.py): /v1 routes only
            if not api_key or not self.path.startswith("/v1"):
                return True
            if self.headers.get("Authorization") == "Bearer " + api_key:
                return True
            self.body()
            self.send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self):
            self._body = None
            if not self.authorized():
                return
            if self.path == "/health":
                return self.send(200 if engine.ready() else 503, b"", "text/plain")
            if self.path == "/version":
                return self.send(200, {"version": versions.vllm_version()})
            if self.path == "/v1/models":
                return self.send(200, engine.models())
            if self.path == "/metrics":
                return self.send(200, engine.metrics().encode(), "text/plain; version=0.0.4")
            self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            self._body = None
            if not self.authorized():
                return
            try:
                body = json.loads(self.body() or b"{}")
            except ValueError:
                return self.send(400, lm.error("invalid JSON body"))
            if not engine.ready():
                return self.send(503, lm.error("the engine is not ready", 503))
            if self.path == "/tokenize":
                try:
                    return self.send(200, engine.tokenize(body))
                except lm.RequestError as e:
                    return self.send(e.code, lm.error(str(e), e.code, e.param))
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                return self.send(404, {"detail": "Not Found"})
            chat = self.path == "/v1/chat/completions"
            events = None
            try:
                req = engine.prepare(body, chat)
                if not body.get("stream"):
                    return self.send(200, engine.generate(req, self.client_alive))
                events = engine.generate_stream(req, self.client_alive)
                first = next(events)  # the prefill (and a KV pull) fails before the response starts
            except lm.RequestError as e:
                return self.send(e.code, lm.error(str(e), e.code, e.param))
            except lm.ClientGone:
                self.close_connection = True
                return None
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in _chain(first, events):
                    chunk = ("data: %s\n\n" % event).encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            finally:
                events.close()  # a client that went away mid-stream: its request is aborted

        def client_alive(self):
            """False once the client has closed its connection (vLLM's with_cancellation aborts the request then)."""
            try:
                ready, _w, _x = select.select([self.connection], [], [], 0)
                return not ready or bool(self.connection.recv(1, socket.MSG_PEEK))
            except (OSError, ValueError):
                return False

    return H


def _chain(first, rest):
    yield first
    for item in rest:
        yield item


def rng():
    return random.Random(os.getpid())
