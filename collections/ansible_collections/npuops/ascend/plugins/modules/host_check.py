#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: host_check
short_description: Check what a node needs before a vLLM-Ascend launch, outside the NPUs
version_added: 0.1.0
description:
  - Checks that the NIC the inventory names owns the node IP (HCCL, Gloo and vLLM are told to use it),
    that ports are free, that C(/dev/shm) and the disk are large enough, that the container engine
    answers, and that C(/etc/hccn.conf) lists one address per device.
  - Checks TCP reachability between nodes without the engine running. With O(listen) it starts a
    short-lived listener on the node (detached; it stops after O(listen_seconds) or once it answered
    O(listen_expect) connections). With O(reach) it connects to such listeners, retrying until
    O(reach_timeout), and checks that the preflight listener, not some other process, answered.
  - With O(npu_facts) it also discovers the NPUs the way M(npuops.ascend.npu_facts) does and returns them as the
    C(npu) fact, so preflight needs one module run per node for all of its local checks (each module run costs
    a Python start and the module's import on the node).
  - Each failure is returned as C({check, observed, expected, fix}); nothing on the node changes
    apart from the temporary listener.
  - A reach entry with C(live=true) targets a port the running service holds; it passes when the connection is
    accepted (the service's own listener answers).
author:
  - npuops maintainers (@npuops)
options:
  nic:
    description: The interface that must own O(node_ip) (the inventory's C(npuops_nic)).
    type: str
  node_ip:
    description: The node's address on that interface (the inventory's C(npuops_node_ip)).
    type: str
  ports_free:
    description: TCP ports nothing may listen on yet.
    type: list
    elements: int
    default: []
  shm_min_gb:
    description: Minimum size of C(/dev/shm) in GiB; V(0) skips the check.
    type: int
    default: 0
  weights_path:
    description: Where the model weights go; its file system must have room for O(weights_bytes).
    type: path
  weights_bytes:
    description: Size of the weights; what already lies under O(weights_path) counts as placed.
    type: int
    default: 0
  container_engine:
    description: The container CLI that must answer C(--version).
    type: str
    choices: [docker, podman, isula]
  hccn_conf:
    description: Path of the HCCN configuration; checked when O(hccn_devices) is given.
    type: path
    default: /etc/hccn.conf
  hccn_devices:
    description: Physical device ids that must each have an address in O(hccn_conf).
    type: list
    elements: int
    default: []
  listen:
    description: Ports to listen on temporarily, on O(listen_address).
    type: list
    elements: int
    default: []
  listen_address:
    description: Address the temporary listener binds; defaults to O(node_ip).
    type: str
  listen_seconds:
    description: How long the temporary listener stays up at most.
    type: int
    default: 30
  listen_expect:
    description: Stop the listener after this many connections (V(0) means only O(listen_seconds) stops it).
    type: int
    default: 0
  reach:
    description: Listeners to connect to, each a dict with C(address), C(port) and optionally C(host).
    type: list
    elements: dict
    default: []
  reach_timeout:
    description: Seconds to keep retrying each connection (the listener may still be starting).
    type: int
    default: 15
  token:
    description: Shared secret the listener answers with, so a reach check knows it met the listener (given to the
      listener on its stdin, never in its command line).
    type: str
  image:
    description:
      - The engine image of this node. With O(container_engine), its id and registry digest and the versions it
        holds (vllm, vllm_ascend, torch_npu, torch from their package metadata, CANN from the toolkit's install info)
        are read without starting the engine, in a throw-away container of the image with no network
        (RV(image)). An image not on the node yet is reported as not present.
    type: str
  service_containers:
    description:
      - Names of the containers the service runs on this node (the plan's engine and proxy). Those that exist and
        were made by npuops (they carry its config label) are the service's own; the ports their processes hold
        are returned in RV(held_by_service) instead of failing O(ports_free), and their processes in
        RV(service_pids) (found by the container id in each process's cgroup).
    type: list
    elements: str
    default: []
  npu_facts:
    description:
      - Also discover the NPUs (C(npu-smi info), C(info -m), C(info -t board), the driver and CANN version files)
        and return them as the C(npu) fact, the same as M(npuops.ascend.npu_facts) with its defaults.
      - A failure to discover (no C(npu-smi), a wedged driver, a DCMI error) does not fail the module; it is
        returned in RV(npu_error) and the other checks still run.
    type: bool
    default: false
  npu_smi_path:
    description:
      - Path of C(npu-smi) for O(npu_facts). By default it is looked up on E(PATH), then in C(/usr/local/bin) and
        C(/usr/local/sbin).
    type: path
  binaries:
    description: Programs this host needs (a gateway host's haproxy and keepalived); each missing one is a failed check
      with its RV(failed_checks) fix.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The program's path.
        type: path
        required: true
      fix:
        description: What to do when it is missing.
        type: str
        required: true
  service_pid_files:
    description: Pid files of the service's own daemons here (HAProxy, keepalived, Prometheus); a port their processes
      (or their children) hold is the service's, not a failure.
    type: list
    elements: path
    default: []
  address:
    description: A floating address; RV(address) says whether this host holds it and whether it answers a ping.
    type: str
  command_timeout:
    description: Seconds each external command (C(ip), the container CLI, C(npu-smi)) may take.
    type: int
    default: 30
attributes:
  check_mode:
    description: Runs in check mode; the temporary listener is still started, since it changes nothing lasting.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
seealso:
  - module: npuops.ascend.hccn_check
  - module: npuops.ascend.npu_facts
"""

EXAMPLES = r"""
- name: Host checks of a worker, and can it reach the leader's DP RPC port
  npuops.ascend.host_check:
    nic: enp189s0f0
    node_ip: 10.0.0.12
    ports_free: [8000, 13389]
    shm_min_gb: 16
    weights_path: /data/models/Kimi-K3-W4A8
    weights_bytes: 1500000000000
    container_engine: docker
    hccn_devices: "{{ range(16) | list }}"
    reach:
      - {host: node01, address: 10.0.0.11, port: 13389}
    token: "{{ preflight_token }}"
"""

RETURN = r"""
image:
  description: What O(image) holds.
  returned: when O(image) and O(container_engine) are set
  type: dict
  contains:
    present:
      description: Whether the image is on the node.
      type: bool
    id:
      description: The image id.
      type: str
    digest:
      description: The registry digest (C(sha256:...)) the image was pulled by, when it has one.
      type: str
    versions:
      description: C(vllm), C(vllm_ascend), C(torch_npu), C(torch), C(cann) (null where not installed).
      type: dict
    error:
      description: Why the versions could not be read.
      type: str
ansible_facts:
  description: The C(npu) fact, as M(npuops.ascend.npu_facts) returns it.
  returned: when O(npu_facts) is set and the NPUs were discovered
  type: dict
  contains:
    npu:
      description: The chips, the card/chip to logical/physical id map, HBM, health and the driver and CANN versions.
      type: dict
npu_error:
  description: Why the NPUs could not be discovered (the command and what it printed, and what to do).
  returned: when O(npu_facts) is set and discovery failed
  type: str
  sample: "npu-smi info did not answer within 30s: the driver may be wedged (check dmesg, then reset the device or reboot the node)"
ok:
  description: V(true) when no check failed.
  returned: always
  type: bool
failed_checks:
  description: Every failed check, with what was seen, what was expected and how to fix it.
  returned: always
  type: list
  elements: dict
  sample:
    - check: nic
      observed: eth0 has 10.0.0.99
      expected: eth0 owns 10.0.0.12
      fix: "10.0.0.12 is on enp189s0f0: set npuops_nic: enp189s0f0"
hccn_addresses:
  description: Device addresses from O(hccn_conf), by physical id.
  returned: when O(hccn_devices) is given
  type: dict
  sample: {"0": 10.214.0.1, "1": 10.214.0.2}
shm_bytes:
  description: Size of C(/dev/shm).
  returned: when O(shm_min_gb) is set
  type: int
disk_free_bytes:
  description: Free bytes on the file system of O(weights_path).
  returned: when O(weights_path) is set
  type: int
service:
  description: The service's own containers found on the node (from O(service_containers)).
  returned: always
  type: list
  elements: dict
  sample: [{name: vllm, id: 5f1c..., running: true, status: running, labels: {io.npuops.role: leader}, pids: [4475]}]
service_pids:
  description: Processes of the service's own running containers and of O(service_pid_files).
  returned: always
  type: list
  elements: int
address:
  description: Whether this host holds O(address) (C(held)) and whether it answers a ping from here (C(answers)).
  returned: when O(address) is given
  type: dict
  sample: {address: 192.168.100.250, held: false, answers: false}
held_by_service:
  description: Ports of O(ports_free) that the service's own processes hold (not a failure).
  returned: always
  type: list
  elements: dict
  sample: [{port: 8000, owner: "4475 (python3)"}]
weights_present_bytes:
  description: Bytes already under O(weights_path).
  returned: when O(weights_path) is set
  type: int
engine_version:
  description: First line of the container engine's C(--version).
  returned: when O(container_engine) is set and answers
  type: str
listener_pid:
  description: PID of the temporary listener.
  returned: when O(listen) is given and it started
  type: int
reach_results:
  description: One row per O(reach) target.
  returned: always
  type: list
  elements: dict
"""

import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import container, hccn, host, image_probe, npu_smi, proc


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nic=dict(type="str"),
            node_ip=dict(type="str"),
            ports_free=dict(type="list", elements="int", default=[]),
            shm_min_gb=dict(type="int", default=0),
            weights_path=dict(type="path"),
            weights_bytes=dict(type="int", default=0),
            container_engine=dict(type="str", choices=list(container.ENGINES)),
            hccn_conf=dict(type="path", default="/etc/hccn.conf"),
            hccn_devices=dict(type="list", elements="int", default=[]),
            listen=dict(type="list", elements="int", default=[]),
            listen_address=dict(type="str"),
            listen_seconds=dict(type="int", default=30),
            listen_expect=dict(type="int", default=0),
            reach=dict(type="list", elements="dict", default=[]),
            reach_timeout=dict(type="int", default=15),
            token=dict(type="str", no_log=True),
            service_containers=dict(type="list", elements="str", default=[]),
            image=dict(type="str"),
            npu_facts=dict(type="bool", default=False),
            npu_smi_path=dict(type="path"),
            command_timeout=dict(type="int", default=30),
            binaries=dict(type="list", elements="dict", default=[],
                          options=dict(path=dict(type="path", required=True), fix=dict(type="str", required=True))),
            service_pid_files=dict(type="list", elements="path", default=[]),
            address=dict(type="str"),
        ),
        required_by={"nic": "node_ip"},
        supports_check_mode=True,
    )
    p = module.params

    def run(argv):
        rc, out, err = proc.run(argv, p["command_timeout"])
        return rc, out + err

    problems = []
    result = dict(changed=False, service=[], held_by_service=[])
    service_pids = set()
    if p["service_containers"] and p["container_engine"] and module.get_bin_path(p["container_engine"]):
        engine = container.Engine(module.get_bin_path(p["container_engine"]), timeout=p["command_timeout"])
        try:
            result["service"] = host.service_containers(engine, p["service_containers"])
        except container.ContainerError as e:
            problems.append(host.fail("container_engine", str(e), "%s answers" % p["container_engine"],
                                      "repair the %s installation (is its daemon running?)" % p["container_engine"]))
        for c in result["service"]:
            service_pids.update(c["pids"])
    if p["image"] and p["container_engine"] and module.get_bin_path(p["container_engine"]):
        result["image"] = image_probe.read(proc.run, module.get_bin_path(p["container_engine"]), p["image"],
                                           p["command_timeout"])
    service_pids.update(host.pid_file_tree(p["service_pid_files"]))
    result["service_pids"] = sorted(service_pids)
    problems += host.check_binaries(p["binaries"])
    if p["address"]:
        result["address"] = host.address_state(p["address"], run, host.ipv4_addresses(run))
    if p["npu_facts"]:
        try:
            tool = npu_smi.locate(module.get_bin_path, p["npu_smi_path"])
            result["ansible_facts"] = {"npu": npu_smi.discover(npu_smi.runner(tool, p["command_timeout"]))}
        except (npu_smi.NpuSmiError, OSError) as e:
            result["npu_error"] = str(e)
    if p["nic"]:
        problems += host.check_nic(host.ipv4_addresses(run), p["nic"], p["node_ip"])
    if p["ports_free"]:
        found, result["held_by_service"] = host.check_ports_free(p["ports_free"], service_pids=service_pids)
        problems += found
    if p["shm_min_gb"]:
        result["shm_bytes"], found = host.check_shm(p["shm_min_gb"] * host.GIB)
        problems += found
    if p["weights_path"]:
        result["disk_free_bytes"], result["weights_present_bytes"], found = host.check_disk(
            p["weights_path"], p["weights_bytes"])
        problems += found
    if p["container_engine"]:
        result["engine_version"], found = host.check_engine(p["container_engine"], module.get_bin_path, run)
        problems += found
    if p["hccn_devices"]:
        addresses, found = host.check_hccn_conf(p["hccn_conf"], p["hccn_devices"], hccn.parse_hccn_conf)
        result["hccn_addresses"] = dict((str(k), v) for k, v in addresses.items())
        problems += found
    if p["listen"]:
        address = p["listen_address"] or p["node_ip"]
        if not address:
            module.fail_json(msg="listen needs listen_address or node_ip")
        if not p["token"]:
            module.fail_json(msg="listen needs token (the reach side checks it)")
        pid, found = host.start_listener(sys.executable, address, p["listen"], p["token"], p["listen_seconds"],
                                         p["listen_expect"])
        result["listener_pid"] = pid
        problems += found
    reach_results = []
    if p["reach"]:
        if not p["token"]:
            module.fail_json(msg="reach needs token (the one the listener was started with)")
        for t in p["reach"]:
            if "address" not in t or "port" not in t:
                module.fail_json(msg="reach entries need address and port, got %r" % (t,))
        reach_results, found = host.check_reach(p["reach"], p["token"], p["reach_timeout"])
        problems += found
    result.update(ok=not problems, failed_checks=problems, reach_results=reach_results)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
