"""Bring a simulated cluster up, inject faults into it, and take it down again.

A node is: a network namespace (`<prefix>-nNN`) with a management NIC on the `<prefix>-mgmt` bridge and a
fabric NIC on the `<prefix>-fab` bridge carrying the node's 16 NPU device addresses; a private mount and
UTS namespace in which /etc, /usr/local and /dev are overlays over the host's (so the node has its own
/etc/hccn.conf, driver files, fake npu-smi/hccn_tool, /dev/davinci*, podman configuration) and /root, /run,
/tmp, /srv, /dev/shm are its own; and an sshd started inside both, which is how Ansible reaches it. The
simulator's own directory (SIM_ROOT, which holds the nodes' files) stays at its path inside every node, also
when it lies under one of those (a SIM_ROOT in the temporary directory: a second checkout's cluster).

Everything created is recorded in `<cluster dir>/state.json` as it is created, so `down` removes exactly
that (processes by PID and by membership of the node's own namespaces), also after a crash halfway up.
"""
import hashlib
import ipaddress
import json
import os
import shutil
import shlex
import signal
import socket
import subprocess
import threading
import time

from . import image, paths, plan, profile as prof
from .node_tools import npu_smi as npu_smi_tool

SSHD = "/usr/sbin/sshd"
SHM_SIZE = "16g"
SMALL_SHM = "64m"  # Docker's default shm is 64 MB: what the no_shm fault gives the node (vllm-ascend PR #3519)
DEFAULT_BUSY_PORT = 8000
# what each node mounts of its own, in this order (boot_script); SIM_ROOT stays reachable under any of them
NODE_MOUNT_POINTS = ("/etc", "/usr/local", "/root", "/dev", "/dev/pts", "/dev/ptmx", "/dev/shm", "/run", "/tmp", "/srv",
                     "/var/lib/npuops")
MOUNT_STAGE = "mount.stage"
# the nodes' overlay mount options and sshd_config carry the simulator's paths as they are
# a Unix socket's path holds at most 107 bytes; ssh binds a control socket as <ControlPath>.<16 random chars>
# and %C is 40 hex chars
SOCKET_PATH_MAX, CONTROL_SOCKET_NAME = 107, 1 + 40 + 17
SHORT_CONTROL_DIRS = "/run/npuops-sim"
UNSAFE_IN_SIM_ROOT = ",:\"'\\#"


class SimError(Exception):
    pass


def run(argv, check=True, input=None, timeout=60):
    proc = subprocess.run(argv, input=input, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise SimError("%s failed (rc=%d): %s" % (" ".join(argv), proc.returncode, proc.stderr.strip()))
    return proc


def check_sim_root(root):
    """Refuse a SIM_ROOT the nodes cannot boot from, saying why; create it. Any other writable directory works:
    a node mount over one of its parents (/tmp, /srv, ...) gets SIM_ROOT bound back in (boot_script)."""
    real = os.path.realpath(root)
    if real in NODE_MOUNT_POINTS or real == "/dev/pts" or real.startswith("/dev/pts/"):
        raise SimError("SIM_ROOT=%s: each node mounts its own %s there, which would hide the simulator's files from "
                       "the nodes; use a directory below it (e.g. mktemp -d)" % (root, real))
    bad = sorted(set(c for c in real if c in UNSAFE_IN_SIM_ROOT or not c.isprintable() or c.isspace()))
    if bad:
        raise SimError("SIM_ROOT=%s: contains %s, which the nodes' overlay mount options and sshd_config cannot "
                       "carry; use a path without them" % (root, ", ".join(repr(c) for c in bad)))
    try:
        os.makedirs(real, exist_ok=True)
    except OSError as e:
        raise SimError("SIM_ROOT=%s: cannot create it (%s); give a writable directory" % (root, e.strerror))
    if not os.access(real, os.W_OK | os.X_OK):
        raise SimError("SIM_ROOT=%s: not writable (read-only file system?); give a writable directory" % root)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purposes
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ns_inode(pid, kind):
    try:
        return os.stat("/proc/%d/ns/%s" % (pid, kind)).st_ino
    except OSError:
        return None


def pids_in_mount_ns(inode):
    """PIDs whose mount namespace is `inode` (a node's own namespace, so this never matches other work)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and ns_inode(int(entry), "mnt") == inode:
            out.append(int(entry))
    return out


def terminate(pids, grace=3.0):
    pids = [p for p in pids if p != os.getpid() and pid_alive(p)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class Cluster:
    def __init__(self, prefix="npsim", address_plan=None, log=print):
        self.names = plan.Names(prefix)
        self.plan = address_plan or plan.AddressPlan()
        self.dir = paths.cluster_dir(prefix)
        self.state_path = os.path.join(self.dir, "state.json")
        self.log = log
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- state
    def load(self):
        try:
            with open(self.state_path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def save(self, state):
        with self._lock:
            write(self.state_path, json.dumps(state, indent=1, sort_keys=True))

    def ssh_dir(self):
        return os.path.join(self.dir, "ssh")

    def node_dir(self, name):
        return os.path.join(self.dir, "nodes", name)

    def control_dir(self):
        """Where the controller's ssh control sockets go: <ssh dir>/cp, or, when a socket's path there would be too
        long for a Unix socket (a deep SIM_ROOT), a short directory of this cluster's own under /run."""
        d = os.path.join(self.ssh_dir(), "cp")
        if len(d) + CONTROL_SOCKET_NAME <= SOCKET_PATH_MAX:
            return d
        return os.path.join(SHORT_CONTROL_DIRS, "cp-%s-%s" % (self.names.prefix,
                                                               hashlib.sha256(self.dir.encode()).hexdigest()[:12]))

    # ----------------------------------------------------------------- up
    def up(self, count, generation="a3", faults=(), inventory=None, tier=None, superpod=False, ping_interval=None,
           gateways=0, replicas=1, monitors=0, prefill_nodes=None):
        if os.geteuid() != 0:
            raise SimError("the simulator needs root (network and mount namespaces); run it as root")
        check_sim_root(paths.root())
        if replicas < 1 or count % replicas:
            raise SimError("REPLICAS=%d must divide NODES=%d (every instance has the same tier)" % (replicas, count))
        specs = plan.nodes(count, generation, self.names, self.plan, gateways=gateways, monitors=monitors)
        if self.load() is not None or os.path.isdir(self.dir):
            raise SimError("a simulated cluster %r is already up (or half up); run `make sim-down` first"
                           % self.names.prefix)
        self.check_addresses_free()
        timings = {}
        t0 = time.monotonic()
        image_name = image.ensure(log=self.log)
        timings["image"] = time.monotonic() - t0

        os.makedirs(self.dir)
        state = {"prefix": self.names.prefix, "generation": generation, "count": count, "superpod": superpod,
                 "gateways": gateways, "replicas": replicas, "monitors": monitors,
                 "plan": {"mgmt": self.plan.mgmt, "fabric": self.plan.fabric}, "image": image_name,
                 "bridges": [], "nodes": {}, "helpers": [], "inventory": inventory, "tier": tier,
                 # podman makes this cgroup parent on first use; remove it at down only if we caused it
                 "libpod_cgroups_existed": bool(libpod_cgroup_parents())}
        self.save(state)
        try:
            t1 = time.monotonic()
            self.make_ssh_identity(specs)
            self.make_bridges(state)
            for spec in specs:
                self.make_node_files(spec, specs, generation, superpod, ping_interval)
                self.make_node_network(state, spec)
            timings["network"] = time.monotonic() - t1
            t2 = time.monotonic()
            for spec in specs:
                self.start_node(state, spec)
            self.wait_nodes(state, specs)
            timings["sshd"] = time.monotonic() - t2
            for item in faults:
                self.fault(**item)
            if inventory:
                self.write_inventory(inventory, specs, generation, tier, replicas, prefill_nodes)
        except BaseException:
            self.log("sim up failed; tearing down what was created")
            self.down()
            raise
        timings["total"] = time.monotonic() - t0
        return specs, timings

    def check_addresses_free(self):
        ours = {self.names.mgmt_bridge(), self.names.fabric_bridge()}
        routes = json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]")
        for r in routes:
            dst = r.get("dst")
            if not dst or dst == "default" or r.get("dev") in ours or r.get("type") in ("local", "broadcast"):
                continue
            try:
                net = ipaddress.ip_network(dst, strict=False)
            except ValueError:
                continue
            for mine in (self.plan.mgmt_net, self.plan.fabric_net):
                if net.overlaps(mine):
                    raise SimError("address plan %s overlaps the existing route %s dev %s on this machine; "
                                   "pick other private ranges (SIM_MGMT_NET / SIM_FABRIC_NET)"
                                   % (mine, dst, r.get("dev")))

    def make_ssh_identity(self, specs):
        d = self.ssh_dir()
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.makedirs(self.control_dir(), mode=0o700, exist_ok=True)
        key = os.path.join(d, "id_ed25519")
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "npuops-sim-%s" % self.names.prefix, "-f", key])
        with open(key + ".pub") as f:
            write(os.path.join(d, "authorized_keys"), f.read(), 0o600)
        known = []
        for spec in specs:
            hk = os.path.join(self.node_dir(spec.name), "ssh_host_ed25519_key")
            os.makedirs(os.path.dirname(hk), exist_ok=True)
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", spec.name, "-f", hk])
            with open(hk + ".pub") as f:
                pub = " ".join(f.read().split()[:2])
            known.append("%s,%s %s" % (spec.mgmt_ip, spec.name, pub))
        write(os.path.join(d, "known_hosts"), "\n".join(known) + "\n", 0o600)

    def make_bridges(self, state):
        for name, addr in ((self.names.mgmt_bridge(), "%s/%d" % (self.plan.mgmt_gateway(),
                                                                  self.plan.mgmt_net.prefixlen)),
                           (self.names.fabric_bridge(), "%s/%d" % (self.plan.fabric_gateway(),
                                                                    self.plan.fabric_net.prefixlen))):
            run(["ip", "link", "add", "name", name, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
            state["bridges"].append(name)
            self.save(state)
            run(["ip", "addr", "add", addr, "dev", name])
            run(["ip", "link", "set", name, "up"])

    def make_node_network(self, state, spec):
        ns = spec.netns
        run(["ip", "netns", "add", ns])
        state["nodes"][spec.name] = {"index": spec.index, "netns": ns, "mgmt_ip": spec.mgmt_ip,
                                     "fabric_ip": spec.fabric_ip, "dir": self.node_dir(spec.name), "gateway": spec.gateway,
                                     "veths": [], "sshd_pid": None, "mntns": None}
        self.save(state)
        node = state["nodes"][spec.name]
        for host_end, node_end, bridge in ((self.names.mgmt_veth(spec.index), plan.MGMT_NIC, self.names.mgmt_bridge()),
                                           (self.names.fabric_veth(spec.index), plan.FABRIC_NIC,
                                            self.names.fabric_bridge())):
            run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end, "netns", ns])
            node["veths"].append(host_end)
            self.save(state)
            run(["ip", "link", "set", host_end, "master", bridge, "up"])
        fab_len = self.plan.fabric_net.prefixlen
        batch = ["link set lo up", "link set %s up" % plan.MGMT_NIC, "link set %s up" % plan.FABRIC_NIC,
                 "addr add %s/%d dev %s" % (spec.mgmt_ip, self.plan.mgmt_net.prefixlen, plan.MGMT_NIC),
                 # the node's own fabric address first: it is the primary, device addresses are secondaries
                 "addr add %s/%d dev %s" % (spec.fabric_ip, fab_len, plan.FABRIC_NIC)]
        batch += ["addr add %s/%d dev %s" % (d["ip"], fab_len, plan.FABRIC_NIC) for d in spec.devices]
        run(["ip", "-n", ns, "-batch", "-"], input="\n".join(batch) + "\n")

    def make_node_files(self, spec, all_specs, generation, superpod, ping_interval=None):
        d = self.node_dir(spec.name)
        for sub in ("etc.up", "etc.work", "usr.up", "usr.work", "dev.up", "dev.work", "root", "tmp", "srv/models",
                    "containers", "varlib", MOUNT_STAGE):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        os.chmod(os.path.join(d, "tmp"), 0o1777)
        # a server's own root home, not this machine's (whose shell start-up files may be slow or odd)
        os.chmod(os.path.join(d, "root"), 0o700)
        for src, dst in (("/usr/share/base-files/dot.bashrc", ".bashrc"), ("/usr/share/base-files/dot.profile",
                                                                          ".profile")):
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(d, "root", dst))
        healthy = prof.build(spec, generation, self.plan, superpod=superpod)
        if ping_interval:
            healthy["ping_interval"] = float(ping_interval)
        write(os.path.join(d, "profile.healthy.json"), json.dumps(healthy, indent=1))
        self.write_driver_files(d, healthy, upper=True)
        etc = os.path.join(d, "etc.up")
        write(os.path.join(etc, "hccn.conf"), prof.hccn_conf(healthy))
        write(os.path.join(etc, "ascend_install.info"), prof.ascend_install_info())
        write(os.path.join(etc, "hostname"), spec.name + "\n")
        if spec.gateway:
            # a gateway host has no NPUs: no hccn.conf, fake NPU tools or davinci devices (its haproxy and
            # keepalived are the machine's own, from the OS packages, seen through the /usr overlay)
            os.unlink(os.path.join(etc, "hccn.conf"))
        hosts = ["127.0.0.1 localhost"] + ["%s %s" % (n.mgmt_ip, n.name) for n in all_specs]
        write(os.path.join(etc, "hosts"), "\n".join(hosts) + "\n")
        write(os.path.join(etc, "containers", "containers.conf"), paths.CONTAINERS_CONF)
        write(os.path.join(etc, "containers", "storage.conf"),
              '[storage]\ndriver = "overlay"\ngraphroot = "%s"\nrunroot = "/run/containers/storage"\n'
              '[storage.options]\nadditionalimagestores = ["%s"]\n'
              % (os.path.join(d, "containers"), paths.image_store()))
        usr = os.path.join(d, "usr.up")
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_tools")
        npu_tools = () if spec.gateway else (("npu_smi.sh", "bin/npu-smi"),
                                             ("hccn_tool.sh", "Ascend/driver/tools/hccn_tool"))
        for src, dst in npu_tools + (("engine_cli.py", "bin/docker"), ("engine_cli.py", "bin/isula"),
                                     ("engine_cli.py", "bin/podman")):
            target = os.path.join(usr, dst)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(os.path.join(here, src), target)
            os.chmod(target, 0o755)
        os.makedirs(os.path.join(usr, "dcmi"), exist_ok=True)
        dev = os.path.join(d, "dev.up")
        count = 0 if spec.gateway else plan.DEVICES[generation]
        for i in range(count):
            os.mknod(os.path.join(dev, "davinci%d" % i), 0o666 | 0o020000, os.makedev(241, i))
        for i, name in enumerate(() if spec.gateway else ("davinci_manager", "devmm_svm", "hisi_hdc")):
            os.mknod(os.path.join(dev, name), 0o666 | 0o020000, os.makedev(242, i))
        write(os.path.join(d, "boot.sh"), self.boot_script(spec, d), 0o755)
        write(os.path.join(d, "sshd_config"), self.sshd_config(spec, d))

    def write_driver_files(self, base, p, upper):
        """Driver/CANN state of a node. `base` is the node dir (upper=True, before boot) or its live root."""
        usr = os.path.join(base, "usr.up") if upper else os.path.join(base, "usr/local")
        write(os.path.join(usr, "Ascend/driver/lib64/npuops_sim/profile.json"), json.dumps(p, indent=1))
        hccn = os.path.join(usr, "Ascend/driver/lib64/npuops_sim/hccn")
        if os.path.isdir(hccn):
            shutil.rmtree(hccn)
        for rel, text in prof.render_hccn(p).items():
            write(os.path.join(hccn, rel), text)
        smi = os.path.join(usr, "Ascend/driver/lib64/npuops_sim/npu_smi")
        if os.path.isdir(smi):
            shutil.rmtree(smi)
        for rel, text in npu_smi_tool.render_all(p).items():
            write(os.path.join(smi, rel), text)
        # the renderer itself, for the answers that depend on the node's live processes
        shutil.copyfile(npu_smi_tool.__file__, os.path.join(usr, "Ascend/driver/lib64/npuops_sim/npu_smi.py"))
        write(os.path.join(usr, "Ascend/driver/version.info"), prof.version_info(p))
        write(os.path.join(usr, "Ascend/ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info"),
              prof.toolkit_install_info(p))

    def boot_script(self, spec, d):
        q = shlex.quote
        ov = "-t overlay overlay -o lowerdir={low},upperdir=%s/{n}.up,workdir=%s/{n}.work" % (d, d)
        mounts = [("/etc", ov.format(low="/etc", n="etc")), ("/usr/local", ov.format(low="/usr/local", n="usr")),
                  ("/root", "--bind %s/root" % d), ("/dev", ov.format(low="/dev", n="dev")),
                  ("/dev/pts", "-t devpts -o newinstance,ptmxmode=0666,mode=620 devpts"),
                  ("/dev/ptmx", "--bind /dev/pts/ptmx"), ("/dev/shm", "-t tmpfs -o size=%s,mode=1777 shm" % SHM_SIZE),
                  ("/run", "-t tmpfs -o mode=755,size=256m run"), ("/tmp", "--bind %s/tmp" % d),
                  ("/srv", "--bind %s/srv" % d),
                  # the node's own state (records, keys, HAProxy's server state), as on a real host: never shared
                  # with the other nodes or another cluster on this machine
                  ("/var/lib/npuops", "--bind %s/varlib" % d)]
        assert [m[0] for m in mounts] == list(NODE_MOUNT_POINTS)
        root = os.path.realpath(paths.root())
        stage = os.path.join(d, MOUNT_STAGE)
        lines = ["#!/bin/sh", "# node boot: runs inside the node's own network, mount and UTS namespaces",
                 "set -e", "hostname %s" % spec.name]
        for target, how in mounts:
            if target == "/var/lib/npuops":
                lines.append("mkdir -p %s" % target)  # on the machine's own /var: an empty mount point
            if not os.path.relpath(root, target).startswith(".."):
                # the mount would hide SIM_ROOT (and this node's own files under it): it is made at a staging
                # directory first, SIM_ROOT is bound into it at its own path, and the whole moves into place
                inside = os.path.join(stage, os.path.relpath(root, target))
                lines += ["mount %s %s" % (how, q(stage)), "mkdir -p %s" % q(inside),
                          "mount --bind %s %s" % (q(root), q(inside)), "mount -n --move %s %s" % (q(stage), target)]
            else:
                lines.append("mount %s %s" % (how, target))
            if target == "/run":
                lines.append("mkdir -p /run/sshd /run/lock")
        lines.append("exec %s -D -e -f %s/sshd_config" % (SSHD, d))
        return "\n".join(lines) + "\n"

    def sshd_config(self, spec, d):
        return "\n".join([
            "ListenAddress %s" % spec.mgmt_ip, "Port 22", "HostKey %s/ssh_host_ed25519_key" % d, "PidFile none",
            "AuthorizedKeysFile %s/authorized_keys" % self.ssh_dir(), "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "UseDNS no", "MaxStartups 200:30:400", "MaxSessions 100", "Subsystem sftp internal-sftp", ""])

    def start_node(self, state, spec):
        d = self.node_dir(spec.name)
        logf = open(os.path.join(d, "sshd.log"), "ab")
        try:
            proc = subprocess.Popen(
                ["nsenter", "--net=/run/netns/%s" % spec.netns, "--", "unshare", "--mount", "--uts",
                 "--propagation", "private", "--", "/bin/sh", os.path.join(d, "boot.sh")],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
        finally:
            logf.close()
        state["nodes"][spec.name]["sshd_pid"] = proc.pid
        self.save(state)

    def wait_nodes(self, state, specs, timeout=30.0):
        deadline = time.monotonic() + timeout
        pending = {s.name: s for s in specs}
        while pending:
            for name, spec in list(pending.items()):
                node = state["nodes"][name]
                if not pid_alive(node["sshd_pid"]):
                    raise SimError("%s: sshd exited during boot:\n%s" % (name, self.log_tail(name)))
                try:
                    with socket.create_connection((spec.mgmt_ip, 22), timeout=0.5) as s:
                        if s.recv(4).startswith(b"SSH-"):
                            node["mntns"] = ns_inode(node["sshd_pid"], "mnt")
                            del pending[name]
                except OSError:
                    pass
            if pending and time.monotonic() > deadline:
                raise SimError("nodes did not answer on ssh within %ds: %s" % (timeout, ", ".join(sorted(pending))))
            if pending:
                time.sleep(0.05)
        self.save(state)

    def log_tail(self, name, lines=20):
        try:
            with open(os.path.join(self.node_dir(name), "sshd.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    # ----------------------------------------------------------------- inventory
    def write_inventory(self, path, specs, generation, tier=None, replicas=1, prefill_nodes=None):
        """``prefill_nodes``: a prefill/decode tier as xPyD, the first N nodes of each instance prefill and the rest
        decode (npuops_prefill_nodes / npuops_decode_nodes in the inventory)."""
        docs = tier_documents()
        npu = [s for s in specs if not s.gateway]
        gateways = [s for s in specs if s.group == "gateway"]
        monitors = [s for s in specs if s.group == "monitor"]
        size = len(npu) // replicas
        if tier is None:
            # the tier of this many nodes per instance, when exactly one has that size
            sized = [name for name, doc in docs.items() if int(doc["nodes"]) == size
                     and str(doc.get("generation", "A3")).upper() == str(generation).upper()]
            if len(sized) > 1:  # a prefill/decode tier is asked for by name (--tier)
                sized = [n for n in sized if not any(g.get("kv_role") for g in docs[n]["groups"])]
            tier = sized[0] if len(sized) == 1 else None
        doc = docs.get(tier) if tier else None
        pd_sizes = {}
        if doc and prefill_nodes:
            sides = [g for g in doc["groups"] if g.get("kv_role")]
            if len(sides) != 2 or not 0 < prefill_nodes < size:
                raise SimError("--prefill-nodes %d needs a prefill/decode tier and 1..%d" % (prefill_nodes, size - 1))
            pd_sizes = {sides[0]["name"]: prefill_nodes, sides[1]["name"]: size - prefill_nodes}
            doc = dict(doc, groups=[dict(g, nodes=pd_sizes.get(g["name"], g["nodes"])) for g in doc["groups"]])
        ssh = self.ssh_dir()
        lines = [
            "# Written by `make sim-up` (npuops_sim) for the simulated cluster on this machine; not committed.",
            "# Static settings of the simulated cluster are in group_vars/ next to this file.",
            "all:", "  vars:",
            "    ansible_user: root",
            "    ansible_python_interpreter: /usr/bin/python3",
            "    ansible_ssh_private_key_file: %s/id_ed25519" % ssh,
            "    ansible_ssh_common_args: >-",
            "      -o UserKnownHostsFile=%s/known_hosts -o StrictHostKeyChecking=yes" % ssh,
            "      -o ControlMaster=auto -o ControlPersist=60s -o ControlPath=%s/%%C" % self.control_dir(),
            "    npuops_image: %s:%s" % (image.REPOSITORY, image.tier_tag(tier, generation)),
        ]
        if tier:
            lines.append("    npuops_tier: %s" % tier)
        lines += ["    npuops_%s_nodes: %d" % kv for kv in sorted(pd_sizes.items())]
        if gateways:
            lines.append("    npuops_gateway_vip: %s" % self.plan.gateway_vip())
        instances = [npu[k * size:(k + 1) * size] for k in range(replicas)]
        if doc and doc.get("proxy") and replicas == 1:
            lines.append("    npuops_proxy_host: %s" % specs[0].name)

        def host_lines(s, indent):
            return ["%s%s:" % (indent, s.name)] + ["%s  %s" % (indent, x) for x in (
                "ansible_host: %s" % s.mgmt_ip, "npuops_node_ip: %s" % s.mgmt_ip, "npuops_nic: %s" % plan.MGMT_NIC,
                "npuops_fabric_ip: %s" % s.fabric_ip)]

        lines += ["  children:", "    npu_nodes:"]
        if replicas == 1:
            lines.append("      hosts:")
            for s in npu:
                lines += host_lines(s, "        ")
        else:
            # one group per instance under npu_nodes; npuops_instance names it (instance_a -> a, ...)
            lines.append("      children:")
            for k, members in enumerate(instances):
                name = chr(ord("a") + k)
                lines += ["        instance_%s:" % name, "          vars:", "            npuops_instance: %s" % name]
                if doc and doc.get("proxy"):
                    lines.append("            npuops_proxy_host: %s" % members[0].name)
                lines.append("          hosts:")
                for s in members:
                    lines += host_lines(s, "            ")
        for group in (doc or {}).get("groups", []):
            if group.get("inventory_group", "npu_nodes") == "npu_nodes":
                continue
            members = []
            for inst in instances:
                taken = sum(int(g["nodes"]) for g in doc["groups"][:doc["groups"].index(group)])
                members += inst[taken:taken + int(group["nodes"])]
            lines += ["    %s:" % group["inventory_group"], "      hosts:"] + ["        %s:" % s.name for s in members]
        if gateways:
            lines += ["    gateway:", "      hosts:"]
            for s in gateways:
                lines += host_lines(s, "        ")
        if monitors:
            lines += ["    monitor:", "      hosts:"]
            for s in monitors:
                lines += host_lines(s, "        ")
        write(path, "\n".join(lines) + "\n")
        state = self.load()
        state["inventory"] = os.path.abspath(path)
        # an inventory written elsewhere (tests, benchmarks, molecule) gets the simulated cluster's static
        # settings too, as inventories/sim has them next to its hosts.yml
        link = os.path.join(os.path.dirname(os.path.abspath(path)), "group_vars")
        if not os.path.lexists(link):
            os.symlink(paths.SIM_GROUP_VARS, link)
            state["group_vars_link"] = link
        self.save(state)

    # ----------------------------------------------------------------- node access
    def node(self, name_or_index):
        state = self.load()
        if state is None:
            raise SimError("no simulated cluster is up; run `make sim-up` first")
        name = name_or_index
        if str(name_or_index).isdigit():
            name = self.names.host(int(name_or_index))
        node = state["nodes"].get(name)
        if node is None:
            raise SimError("no node %r in the simulated cluster (nodes: %s)" % (name_or_index,
                                                                              ", ".join(sorted(state["nodes"]))))
        pid = node["sshd_pid"]
        if not pid or not pid_alive(pid) or ns_inode(pid, "mnt") != node["mntns"]:
            raise SimError("%s is not running (its sshd is gone); bring the cluster up again" % name)
        return name, node, state

    def root_of(self, name):
        """The node's file system as the node sees it (through its sshd's mount namespace)."""
        _name, node, _state = self.node(name)
        return "/proc/%d/root" % node["sshd_pid"]

    def nsenter(self, name, argv, timeout=60, check=True, input=None):
        _name, node, _state = self.node(name)
        return run(["nsenter", "-t", str(node["sshd_pid"]), "--mount", "--net", "--uts", "--"] + list(argv),
                   check=check, timeout=timeout, input=input)

    def spawn(self, name, argv):
        """A background process inside the node (recorded, so `down` and `clear` stop it by PID)."""
        _name, node, state = self.node(name)
        proc = subprocess.Popen(["nsenter", "-t", str(node["sshd_pid"]), "--mount", "--net", "--uts", "--"]
                                + list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        return proc.pid

    def read_profile(self, name):
        with open(self.root_of(name) + paths.PROFILE_IN_NODE) as f:
            return json.load(f)

    def healthy_profile(self, name):
        with open(os.path.join(self.node_dir(name), "profile.healthy.json")) as f:
            return json.load(f)

    def write_profile(self, name, p):
        root = self.root_of(name)
        self.write_driver_files(root, p, upper=False)

    # ----------------------------------------------------------------- faults
    def fault(self, node, fault, device=None, peer=None, port=None, container="vllm"):
        name, info, state = self.node(node)
        if fault == "clear":
            return self.clear(name, device)
        p = self.read_profile(name)
        extra = {}
        if fault == "fabric_cut":
            peer_name, peer_info, _ = self.node(peer if peer is not None else "")
            if peer_name == name:
                raise SimError("fabric_cut needs PEER=<another node>")
            for a, b in ((info, peer_info), (peer_info, info)):
                run(["ip", "-n", a["netns"], "route", "replace", "prohibit", self.plan.node_fabric_block(b["index"])])
            self.write_profile(peer_name, prof.apply_fault(self.read_profile(peer_name), fault, peer=name))
            extra["peer"] = peer_name
        elif fault == "link_down":
            ip = p["devices"][str(device)]["ip"] if str(device) in p["devices"] else None
            if ip:
                run(["ip", "-n", info["netns"], "addr", "del", "%s/%d" % (ip, self.plan.fabric_net.prefixlen),
                     "dev", plan.FABRIC_NIC], check=False)
        elif fault == "hccn_conf_missing":
            try:
                os.unlink(self.root_of(name) + "/etc/hccn.conf")
            except FileNotFoundError:
                pass
        elif fault in ("jemalloc_preload", "old_mooncake"):
            self.container_defaults(name, p.get("faults", []) + [{"fault": fault}])
        elif fault == "no_shm":
            self.nsenter(name, ["mount", "-o", "remount,size=%s" % SMALL_SHM, "/dev/shm"])
        elif fault == "node_down":
            # the node's cables pulled: management and fabric links down at the switch (the bridge side)
            for link in (self.names.mgmt_veth(info["index"]), self.names.fabric_veth(info["index"])):
                run(["ip", "link", "set", link, "down"])
        elif fault in ("engine_hang", "relay_hang"):
            pids = self.engine_pids(name, container) if fault == "engine_hang" else self.weight_server_pids(info)
            if not pids:
                raise SimError("%s: %s found no %s to freeze" % (name, fault, "container %s" % container
                                                                if fault == "engine_hang" else "weight server"))
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            extra["pids"] = pids
            if fault == "engine_hang":
                extra["container"] = container
        elif fault == "port_busy":
            port = int(port or DEFAULT_BUSY_PORT)
            pid = self.spawn(name, ["/usr/bin/python3", "-c", BUSY_LISTENER, str(port)])
            state["helpers"].append({"node": name, "pid": pid, "what": "port_busy", "port": port})
            self.save(state)
            wait_listening(info["mgmt_ip"], port)
            extra.update(port=port, pid=pid)
        new = prof.apply_fault(p, fault, device=device, **extra)
        self.write_profile(name, new)
        return new["faults"]

    def clear(self, name, device=None):
        _name, info, state = self.node(name)
        p = self.read_profile(name)
        healthy = self.healthy_profile(name)
        for f in p.get("faults", []):
            if f["fault"] == "fabric_cut":
                _pn, peer_info, _ = self.node(f["peer"])
                for a, b in ((info, peer_info), (peer_info, info)):
                    run(["ip", "-n", a["netns"], "route", "del", "prohibit", self.plan.node_fabric_block(b["index"])],
                        check=False)
                pp = self.read_profile(f["peer"])
                pp["faults"] = [x for x in pp["faults"] if not (x["fault"] == "fabric_cut" and x.get("peer") == name)]
                self.write_profile(f["peer"], pp)
        for f in p.get("faults", []):
            for pid in f.get("pids", []) if f["fault"] in ("engine_hang", "relay_hang") else []:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        for link in (self.names.mgmt_veth(info["index"]), self.names.fabric_veth(info["index"])):
            run(["ip", "link", "set", link, "up"])
        # device addresses back (link_down removed them)
        present = run(["ip", "-n", info["netns"], "-j", "addr", "show", "dev", plan.FABRIC_NIC]).stdout
        have = {a["local"] for i in json.loads(present) for a in i.get("addr_info", [])}
        for dev in healthy["devices"].values():
            if dev["ip"] not in have:
                run(["ip", "-n", info["netns"], "addr", "add", "%s/%d" % (dev["ip"], self.plan.fabric_net.prefixlen),
                     "dev", plan.FABRIC_NIC])
        if not info.get("gateway"):
            write(self.root_of(name) + "/etc/hccn.conf", prof.hccn_conf(healthy))
        self.container_defaults(name, [])
        self.nsenter(name, ["mount", "-o", "remount,size=%s" % SHM_SIZE, "/dev/shm"])
        mine = [h for h in state["helpers"] if h["node"] == name]
        terminate([h["pid"] for h in mine])
        state["helpers"] = [h for h in state["helpers"] if h["node"] != name]
        self.save(state)
        self.write_profile(name, prof.clear_faults(p, healthy))
        return []

    def container_defaults(self, name, faults):
        """What every container of the node gets besides its image (its container engine's default mounts): a jemalloc
        preload (fault jemalloc_preload: /etc/ld.so.preload naming the openEuler images' libjemalloc, as vllm-ascend
        #17155 quotes it) and an older Mooncake transfer engine (fault old_mooncake) over the image's."""
        root = self.root_of(name)
        kinds = set(f["fault"] for f in faults)
        volumes = []
        if "jemalloc_preload" in kinds:
            write(root + paths.CONTAINER_PRELOAD, "/usr/lib64/libjemalloc.so.2\n")
            volumes.append("%s:/etc/ld.so.preload:ro" % paths.CONTAINER_PRELOAD)
        if "old_mooncake" in kinds:
            meta = "%s/mooncake_transfer_engine_npu-%s.dist-info/METADATA" % (paths.CONTAINER_MOONCAKE,
                                                                          paths.OLD_MOONCAKE)
            write(root + meta, "Metadata-Version: 2.1\nName: mooncake-transfer-engine-npu\nVersion: %s\n"
                  % paths.OLD_MOONCAKE)
            volumes.append("%s:%s:ro" % (paths.CONTAINER_MOONCAKE, paths.MOONCAKE_SITE))
        write(root + "/etc/containers/containers.conf", paths.containers_conf(volumes))

    def engine_pids(self, name, container):
        """The processes of a container on the node: its init (as podman reports it) and every descendant."""
        out = self.nsenter(name, ["podman", "inspect", "--format", "{{.State.Pid}}", container], check=False)
        top = int(out.stdout.strip() or 0) if out.returncode == 0 else 0
        return descendants(top) if top > 0 else []

    def weight_server_pids(self, info):
        """The weight servers running in the node (processes of its own mount namespace)."""
        found = []
        for pid in pids_in_mount_ns(info["mntns"]):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"npuops_weight_server.py") for a in argv) and b"serve" in argv:
                found.append(pid)
        return found

    # ----------------------------------------------------------------- down
    def down(self):
        t0 = time.monotonic()
        state = self.load() or {"nodes": {}, "bridges": [], "helpers": []}
        nodes = state.get("nodes", {})
        # 1. containers, through each node's own podman, so podman removes its cgroups and mounts
        threads = []
        for name, node in nodes.items():
            pid = node.get("sshd_pid")
            if pid and pid_alive(pid) and node.get("mntns") and ns_inode(pid, "mnt") == node["mntns"]:
                t = threading.Thread(target=self._remove_containers, args=(pid,), daemon=True)
                t.start()
                threads.append(t)
        for t in threads:
            t.join(timeout=60)
        # 2. every process of the node: its sshd and whatever lives in its mount/network namespaces
        pids = [h["pid"] for h in state.get("helpers", [])]
        for name, node in nodes.items():
            if node.get("mntns"):
                pids += pids_in_mount_ns(node["mntns"])
            if node.get("sshd_pid"):
                pids.append(node["sshd_pid"])
        for ns in self.our_netns(state):
            out = run(["ip", "netns", "pids", ns], check=False).stdout.split()
            pids += [int(p) for p in out if p.isdigit()]
        terminate(sorted(set(pids)))
        # 3. ssh control masters the controller opened to the nodes (named by our control path)
        cp = self.control_dir()
        if os.path.isdir(cp):
            for sock in os.listdir(cp):
                run(["ssh", "-o", "ControlPath=%s" % os.path.join(cp, sock), "-O", "exit", "npuops-sim"],
                    check=False, timeout=10)
            if not cp.startswith(self.dir + os.sep):
                shutil.rmtree(cp, ignore_errors=True)
                try:
                    os.rmdir(SHORT_CONTROL_DIRS)  # the last cluster's
                except OSError:
                    pass
        # 4. links and namespaces, by the names we gave them
        for link in self.our_links(state):
            run(["ip", "link", "del", link], check=False)
        for ns in self.our_netns(state):
            run(["ip", "netns", "del", ns], check=False)
        if not state.get("libpod_cgroups_existed", True):
            for parent in libpod_cgroup_parents():
                # bottom-up; rmdir of a cgroup only succeeds when no process is in it
                for path, _dirs, _files in sorted(os.walk(parent), key=lambda w: -w[0].count("/")):
                    try:
                        os.rmdir(path)
                    except OSError:
                        pass
        # 5. files: the cluster dir (overlay uppers, podman storage, keys) and the generated inventory
        inventory = state.get("inventory")
        if inventory and os.path.isfile(inventory):
            os.unlink(inventory)
        link = state.get("group_vars_link")
        if link and os.path.islink(link):
            os.unlink(link)
        if os.path.isdir(self.dir):
            shutil.rmtree(self.dir)
        return time.monotonic() - t0

    @staticmethod
    def _remove_containers(pid):
        run(["nsenter", "-t", str(pid), "--mount", "--net", "--", "podman", "rm", "--all", "--force", "--time", "2"],
            check=False, timeout=60)

    def our_netns(self, state):
        names = {n["netns"] for n in state.get("nodes", {}).values()}
        listed = run(["ip", "netns", "list"], check=False).stdout.split("\n")
        prefix = self.names.prefix + "-n"
        for line in listed:
            ns = line.split(" ")[0].strip()
            if ns.startswith(prefix) and ns[len(prefix):].isdigit():
                names.add(ns)
        return sorted(names)

    def our_links(self, state):
        links = set(state.get("bridges", []))
        for node in state.get("nodes", {}).values():
            links.update(node.get("veths", []))
        listed = json.loads(run(["ip", "-j", "link", "show"], check=False).stdout or "[]")
        ours = {self.names.mgmt_bridge(), self.names.fabric_bridge()}
        for i in range(1, plan.MAX_NODES + 1):
            ours.update({self.names.mgmt_veth(i), self.names.fabric_veth(i)})
        links.update(link["ifname"] for link in listed if link.get("ifname") in ours)
        present = {link.get("ifname") for link in listed}
        # veths first: deleting one end removes its peer inside the node's namespace
        return sorted(links & present, key=lambda n: (n in (self.names.mgmt_bridge(), self.names.fabric_bridge()), n))


def tier_documents():
    """{name: tier document} of the collection (what the validator and the planner read)."""
    import yaml  # the simulator runs with the controller's Python, which has PyYAML (ansible-core needs it)
    out = {}
    for entry in sorted(os.listdir(paths.TIERS_DIR)):
        if entry.endswith(".yml"):
            with open(os.path.join(paths.TIERS_DIR, entry)) as f:
                doc = yaml.safe_load(f)
            out[doc["name"]] = doc
    return out


def descendants(top):
    """`top` and every process below it (from the parent ids in /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [top]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


def libpod_cgroup_parents():
    """podman's default cgroup parent (cgroupfs manager) in each mounted hierarchy."""
    found = []
    base = "/sys/fs/cgroup"
    candidates = [os.path.join(base, "libpod_parent")]
    if os.path.isdir(base):
        candidates += [os.path.join(base, c, "libpod_parent") for c in os.listdir(base)]
    for path in candidates:
        if os.path.isdir(path):
            found.append(path)
    return found


BUSY_LISTENER = (
    "import socket,sys,time\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(8)\n"
    "time.sleep(86400)\n")


def wait_listening(host, port, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SimError("port %d on %s did not start listening" % (port, host))
