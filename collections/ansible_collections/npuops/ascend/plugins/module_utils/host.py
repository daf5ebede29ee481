# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host-side checks a vLLM-Ascend node needs before launch.

The NIC that HCCL/Gloo are told to use must own the node IP (a wrong one hangs at init or falls back to
loopback: vllm-ascend#9317, #167); the tier's ports must be free (vllm-ascend#4725, #8938); workers must reach the
leader's ports over TCP (firewalls); /dev/shm (vllm-ascend#3717) and the disk must be large enough; the container
engine must answer; /etc/hccn.conf must exist with one address per device (without it PD answers garbage,
vllm-ascend#7711). Each failure is ``{check, observed, expected, fix}``.

A deployment that already runs holds its own ports and processes: what belongs to the service's own containers
(found by name, made by npuops, their processes by the container id in their cgroup) is reported as held by the
service, not as a conflict. Standard library only: this runs on the nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import socket
import subprocess
import time

from ansible_collections.npuops.ascend.plugins.module_utils import container, daemon, proc

GIB = 1024 ** 3


def human(n):
    return "%.1f GiB" % (n / GIB) if n >= GIB else "%d MiB" % (n // (1024 * 1024))


def fail(check, observed, expected, fix, **extra):
    item = {"check": check, "observed": observed, "expected": expected, "fix": fix}
    item.update(extra)
    return item


def ipv4_addresses(run):
    """{nic: [ipv4, ...]} from ``ip -j -4 addr``."""
    rc, out = run(["ip", "-j", "-4", "addr", "show"])
    if rc != 0:
        return None
    nics = {}
    for link in json.loads(out or "[]"):
        nics[link.get("ifname")] = [a.get("local") for a in link.get("addr_info", []) if a.get("local")]
    return nics


def check_nic(nics, nic, node_ip):
    if nics is None:
        return [fail("nic", "`ip -j -4 addr` failed", "the node's addresses", "install iproute2 on the node")]
    owners = sorted(n for n, addrs in nics.items() if node_ip in addrs)
    if nic not in nics:
        return [fail("nic", "no interface named %s (interfaces: %s)" % (nic, ", ".join(sorted(nics))),
                     "%s owns %s" % (nic, node_ip),
                     "set npuops_nic to the interface that owns %s%s" % (
                         node_ip, (": %s" % owners[0]) if owners else " (none does: check npuops_node_ip)"))]
    if node_ip not in nics[nic]:
        return [fail("nic", "%s has %s" % (nic, ", ".join(nics[nic]) or "no IPv4 address"),
                     "%s owns %s" % (nic, node_ip),
                     ("%s is on %s: set npuops_nic: %s" % (node_ip, owners[0], owners[0])) if owners else
                     "npuops_node_ip %s is not an address of this node: fix npuops_node_ip" % node_ip)]
    return []


def _listening(proc_root="/proc"):
    """{port: set(socket inodes)} of TCP listeners (IPv4 and IPv6), from /proc/net/tcp{,6}."""
    ports = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_root, "net", name)) as f:
                lines = f.read().splitlines()[1:]
        except IOError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A":  # TCP_LISTEN
                port = int(parts[1].rsplit(":", 1)[1], 16)
                ports.setdefault(port, set()).add(parts[9])
    return ports


def _owners(inodes, proc_root="/proc"):
    """Which processes hold these socket inodes: [(pid, comm), ...]."""
    wanted = {"socket:[%s]" % i for i in inodes}
    found = []
    for pid in os.listdir(proc_root):
        if not pid.isdigit():
            continue
        fd_dir = os.path.join(proc_root, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    with open(os.path.join(proc_root, pid, "comm")) as f:
                        found.append((int(pid), f.read().strip()))
                    break
            except OSError:
                continue
    return found


def container_pids(container_id, proc_root="/proc"):
    """PIDs whose cgroup path names the container: docker `/docker/<id>`, podman `libpod-<id>`, isula
    `/isulad/<id>` all put the full container id in it, whatever the cgroup driver or version."""
    if not container_id or len(container_id) < 12:
        return set()
    found = set()
    for pid in os.listdir(proc_root):
        if not pid.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, pid, "cgroup")) as f:
                if container_id in f.read():
                    found.add(int(pid))
        except (IOError, OSError):
            continue
    return found


def service_containers(engine, names, proc_root="/proc"):
    """The service's own containers on this node: those of `names` that npuops made (they carry its config
    label), with their state and processes. -> [{name, id, running, status, labels, pids}]."""
    out = []
    for name in names:
        info = engine.inspect(name)
        if not info:
            continue
        st = container.Engine.state(info)
        if not container.ours(st):
            continue  # a container of that name that npuops did not make is not the service's
        pids = container_pids(st["id"], proc_root) if st["running"] else set()
        out.append({"name": name, "id": st["id"], "running": st["running"], "status": st["status"],
                    "labels": st["labels"], "pids": sorted(pids)})
    return out


def check_ports_free(ports, proc_root="/proc", service_pids=()):
    """-> (problems, held): a port whose listeners all belong to the service is `held` (it is the service's own
    port), any other listener is a problem naming its processes."""
    listening = _listening(proc_root)
    service_pids = set(service_pids)
    problems, held = [], []
    for port in sorted(set(ports)):
        if port not in listening:
            continue
        owners = _owners(listening[port], proc_root)
        names = ", ".join("%d (%s)" % o for o in owners) or "a process"
        if owners and all(pid in service_pids for pid, _comm in owners):
            held.append({"port": port, "owner": names})
            continue
        problems.append(fail("port_free", "port %d is in use by %s" % (port, names), "port %d free" % port,
                             "stop the process holding port %d (a stale vLLM or a previous run?) or choose "
                             "another port for the tier" % port, port=port))
    return problems, held


def pid_file_tree(pid_files, proc_root="/proc"):
    """The pids recorded in `pid_files` that run, and all their descendants: a service's own
    processes (HAProxy's master and workers, keepalived, Prometheus), whose ports are the service's (the pid files
    as daemon.pid_in_file reads them)."""
    roots = set(pid for pid in (daemon.pid_file_running(path, proc_root) for path in pid_files or ()) if pid)
    children = {}
    for entry in os.listdir(proc_root) if roots else ():
        if entry.isdigit():
            try:
                with open(os.path.join(proc_root, entry, "stat")) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (IOError, OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def check_binaries(binaries, exists=os.path.exists):
    """`binaries`: [{path, fix}]; each missing one is a problem with its fix."""
    return [fail("packages", "%s is not installed" % b["path"], "%s installed" % b["path"], b["fix"])
            for b in binaries or () if not exists(b["path"])]


def address_state(address, run, addresses=None):
    """Whether this host holds `address`, and whether it answers a ping from here: a floating address that answers
    while no gateway host of the plan holds it belongs to another machine."""
    held = any(address in addrs for addrs in (addresses or {}).values())
    answers = held or run(["ping", "-c", "1", "-W", "1", address])[0] == 0
    return {"address": address, "held": held, "answers": answers}


def check_shm(min_bytes, path="/dev/shm"):
    try:
        st = os.statvfs(path)
    except OSError as e:
        return None, [fail("shm", "%s: %s" % (path, e), "a tmpfs at %s" % path, "mount a tmpfs at /dev/shm")]
    size = st.f_blocks * st.f_frsize
    if size < min_bytes:
        return size, [fail("shm", "/dev/shm is %s" % human(size), "at least %s" % human(min_bytes),
                           "enlarge /dev/shm on the host (mount -o remount,size=%dG /dev/shm); the container gets "
                           "its own --shm-size" % -(-min_bytes // GIB))]
    return size, []


def existing_parent(path):
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def bytes_present(path):
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def check_disk(path, need_bytes):
    """Free space where the weights go, counting what is already there as placed."""
    base = existing_parent(path)
    st = os.statvfs(base)
    free = st.f_bavail * st.f_frsize
    present = bytes_present(path) if os.path.isdir(path) else 0
    missing = max(0, need_bytes - present)
    if free < missing:
        return free, present, [fail("disk", "%.1f GiB free on %s (%.1f GiB of weights already there)"
                                    % (free / GIB, base, present / GIB),
                                    "%.1f GiB free for the rest of the weights" % (missing / GIB),
                                    "free space under %s or point npuops_model_dir at a larger disk" % base)]
    return free, present, []


def check_engine(engine, which, run):
    path = which(engine)
    if not path:
        return None, [fail("container_engine", "%s not found on PATH" % engine, "%s installed" % engine,
                           "install %s on the node, or set npuops_container_engine to the engine it has "
                           "(docker, podman or isula)" % engine)]
    rc, out = run([path, "--version"])
    if rc == proc.TIMED_OUT:
        return None, [fail("container_engine", "%s --version did not answer (is its daemon wedged?)" % engine,
                           "%s answers" % engine, "restart the %s daemon on the node" % engine)]
    if rc != 0:
        return None, [fail("container_engine", "%s --version failed: %s" % (engine, out.strip()[:200]),
                           "%s answers" % engine, "repair the %s installation (is its daemon running?)" % engine)]
    return out.strip().splitlines()[0] if out.strip() else engine, []


def check_hccn_conf(path, expected_devices, parse):
    """/etc/hccn.conf present with an address for every device -> ({phy: address}, problems)."""
    try:
        with open(path) as f:
            text = f.read()
    except IOError:
        return {}, [fail("hccn_conf", "%s is missing" % path, "%s with address_<phy> for every device" % path,
                         "restore %s (hccn_tool -i <phy> -ip -s ... writes it); vLLM-Ascend PD needs it mounted "
                         "into the container, and without it the service answers garbage" % path)]
    conf = parse(text)
    addresses = dict((phy, v["address"]) for phy, v in conf.items() if v.get("address"))
    problems = []
    missing = sorted(set(expected_devices) - set(addresses))
    if missing:
        problems.append(fail("hccn_conf", "%s has no address for devices %s" % (path, missing),
                             "address_<phy> for devices %s" % sorted(expected_devices),
                             "set the device addresses with hccn_tool -i <phy> -ip -s address <ip> netmask <mask>"))
    seen = {}
    for phy, addr in sorted(addresses.items()):
        if addr in seen:
            problems.append(fail("hccn_conf", "devices %d and %d both have %s" % (seen[addr], phy, addr),
                                 "one address per device", "give device %d its own address" % phy, phy_id=phy))
        seen[addr] = phy
    return addresses, problems


LISTENER = r"""
import os, socket, sys, time, select
token = sys.stdin.readline().strip().encode()  # never in argv: `ps` shows argv to every user
until, expect = float(sys.argv[1]), int(sys.argv[2])
socks = []
for spec in sys.argv[3:]:
    host, port = spec.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(64)
    socks.append(s)
os.write(1, b"ready\n")
os.close(1)
seen = 0
while time.time() < until and (expect <= 0 or seen < expect):
    ready, _, _ = select.select(socks, [], [], max(0.0, min(1.0, until - time.time())))
    for s in ready:
        conn, _ = s.accept()
        try:
            conn.sendall(b"npuops " + token + b"\n")
        finally:
            conn.close()
        seen += 1
"""


def start_listener(python, address, ports, token, seconds, expect):
    """A short-lived listener on address:port for each port, answering `npuops <token>` (detached).

    Returns (pid, problems). It stops after `seconds` or once it answered `expect` connections, so the
    ports are free again before the engine starts.
    """
    argv = [python, "-c", LISTENER, str(time.time() + seconds), str(expect)]
    argv += ["%s:%d" % (address, p) for p in ports]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE,
                             close_fds=True, start_new_session=True)
    child.stdin.write(token.encode("utf-8") + b"\n")
    child.stdin.close()
    first = child.stdout.readline()
    if first.strip() != b"ready":
        child.stdin = None  # already closed: communicate() must not flush it
        _out, err = child.communicate()
        lines = (err or b"").decode("utf-8", "replace").strip().splitlines()
        return None, [fail("port_listen", lines[-1] if lines else "the listener did not start",
                           "ports %s bindable on %s" % (ports, address),
                           "free the ports on %s (see port_free) or check that %s is this node's address"
                           % (address, address))]
    return child.pid, []


def probe(address, port, token, timeout):
    """Connect with retries until `timeout`: (ok, detail)."""
    deadline = time.time() + timeout
    last = "no attempt"
    while True:
        try:
            conn = socket.create_connection((address, port), timeout=min(2.0, max(0.2, deadline - time.time())))
            try:
                conn.settimeout(2.0)
                data = conn.recv(128)
            finally:
                conn.close()
            if data.strip() == b"npuops " + token.encode():
                return True, "reached"
            last = "port answered, but not by the preflight listener (%r): something else holds it" % data[:40]
            return False, last
        except socket.timeout:
            last = "timed out"
        except (OSError, socket.error) as e:
            last = str(e)
        if time.time() >= deadline:
            return False, last
        time.sleep(0.2)


def probe_live(address, port, timeout):
    """A port the running service holds: reached when a TCP connection is accepted (its own listener answers)."""
    deadline = time.time() + timeout
    last = "no attempt"
    while True:
        try:
            socket.create_connection((address, port), timeout=min(2.0, max(0.2, deadline - time.time()))).close()
            return True, "reached the running service"
        except socket.timeout:
            last = "timed out"
        except (OSError, socket.error) as e:
            last = str(e)
        if time.time() >= deadline:
            return False, last
        time.sleep(0.2)


def check_reach(targets, token, timeout):
    """Connect to each target: a preflight listener (answering `npuops <token>`), or with `live` the running
    service's own listener on a port it holds."""
    problems = []
    results = []
    for t in targets:
        if t.get("live"):
            ok, detail = probe_live(t["address"], int(t["port"]), timeout)
        else:
            ok, detail = probe(t["address"], int(t["port"]), token, timeout)
        results.append({"host": t.get("host"), "address": t["address"], "port": int(t["port"]), "ok": ok,
                        "detail": detail})
        if not ok:
            peer = t.get("host") or t["address"]
            fix = ("open TCP %s on %s (firewalld?) and check that this node routes to it over its npuops_nic; "
                   "the worker cannot join the leader otherwise" % (t["port"], peer))
            problems.append(fail("reach", "%s:%s (%s) %s" % (t["address"], t["port"], peer, detail),
                                 "TCP connect to %s:%s" % (t["address"], t["port"]), fix, port=int(t["port"])))
    return results, problems
