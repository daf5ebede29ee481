#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: npu_exporter
short_description: Run the npuops NPU exporter on a node as a pid-tracked background process
version_added: 0.2.0
description:
  - Starts (or stops) the node-side NPU exporter, a small standard-library HTTP server that serves Prometheus text
    at C(/metrics) on O(address):O(port) with per chip health, HBM used/total, temperature, power, AI Core
    utilization and processes (from C(npu-smi info)) and per device link state and net health (from
    C(hccn_tool -link -g), C(-net_health -g)). Metric names and labels follow Huawei's MindCluster NPU Exporter.
  - Every command is bounded by O(timeout) and read in the background every O(interval) seconds; a scrape renders
    the last readings, so it answers at once even while npu-smi hangs, and a failed read is exported as
    C(npuops_npu_exporter_read_error) 1 for its source.
  - For hosts without systemd (and the simulated nodes). The process is owned through O(pid_file); converging with
    the same settings changes nothing; other settings restart it. On systemd hosts the monitoring role installs a
    unit with the same command line instead.
  - The module carries the exporter's code (the collection's module_utils) and writes it under O(install_dir) when
    it differs; new code restarts a running exporter. With O(state=installed) it only writes the code (the monitoring
    role's systemd unit runs it).
author:
  - npuops maintainers (@npuops)
options:
  state:
    description: Whether the exporter runs; V(installed) writes its code only.
    type: str
    choices: [started, stopped, installed]
    default: started
  address:
    description: The address to listen on (the node's management address; never 0.0.0.0 by default).
    type: str
  port:
    description: The port to listen on.
    type: int
    default: 9911
  install_dir:
    description: Where the exporter's code is written (C(npuops-npu-exporter) and its C(ansible_collections) tree).
    type: path
    default: /opt/npuops/npu-exporter
  python:
    description: The Python interpreter that runs it.
    type: path
    default: /usr/bin/python3
  npu_smi_path:
    description: npu-smi.
    type: str
    default: npu-smi
  hccn_tool_path:
    description: hccn_tool.
    type: str
    default: /usr/local/Ascend/driver/tools/hccn_tool
  timeout:
    description: Seconds each npu-smi / hccn_tool call may take before it is killed and reported failed.
    type: float
    default: 5
  interval:
    description: Seconds between two rounds of reads (a scrape in between gets the cached readings).
    type: float
    default: 10
  probes:
    description: Health checks to export as C(npuops_probe_success{probe, url}), e.g. the PD proxy's.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The probe's name (label C(probe)).
        type: str
        required: true
      url:
        description: The URL; 2xx is success.
        type: str
        required: true
  containers:
    description:
      - The service's containers on this node (the engine, the PD proxy), exported as
        C(npuops_container_running{container}) 1 or 0 from the container CLI's C(inspect), read like every other
        source (bounded, in the background). A headless worker serves no C(/metrics), so its engine's state reaches
        Prometheus only from here.
    type: list
    elements: str
    default: []
  container_engine:
    description: The container CLI that inspects O(containers).
    type: str
    choices: [docker, podman, isula]
    default: docker
  pid_file:
    description: Where the process is recorded.
    type: path
    default: /run/npuops/npu-exporter.pid
  log_file:
    description: Its output.
    type: path
    default: /run/npuops/npu-exporter.log
  wait_timeout:
    description: Seconds to wait for C(/metrics) to answer after a start.
    type: int
    default: 20
attributes:
  check_mode:
    description: Reports whether it would write code, start, restart or stop the exporter.
    support: full
  diff_mode:
    description: No diff.
    support: none
notes:
  - O(address) is required with O(state=started).
seealso:
  - module: npuops.ascend.managed_process
"""

EXAMPLES = r"""
- name: Run the NPU exporter on the node's management address
  npuops.ascend.npu_exporter:
    address: "{{ npuops_node_ip }}"
    port: 9911
    timeout: 3
    interval: 5
"""

RETURN = r"""
files:
  description: The exporter's files (relative to O(install_dir)) that were (would be) written.
  returned: always
  type: list
  elements: str
  sample: [ansible_collections/npuops/ascend/plugins/module_utils/npu_exporter.py]
action:
  description: What was done to the process (none, started, restarted, stopped).
  returned: always
  type: str
  sample: started
pid:
  description: The exporter's pid.
  returned: when it runs
  type: int
  sample: 4242
url:
  description: Its metrics URL.
  returned: when O(state=started)
  type: str
  sample: http://10.0.0.11:9911/metrics
argv:
  description: Its command line (the systemd unit runs the same).
  returned: when O(address) is given and O(state) is not V(stopped)
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import container, daemon, npu_exporter


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["started", "stopped", "installed"], default="started"),
            address=dict(type="str"),
            port=dict(type="int", default=npu_exporter.DEFAULT_PORT),
            install_dir=dict(type="path", default="/opt/npuops/npu-exporter"),
            python=dict(type="path", default="/usr/bin/python3"),
            npu_smi_path=dict(type="str", default="npu-smi"),
            hccn_tool_path=dict(type="str", default="/usr/local/Ascend/driver/tools/hccn_tool"),
            timeout=dict(type="float", default=5.0),
            interval=dict(type="float", default=10.0),
            probes=dict(type="list", elements="dict", default=[],
                        options=dict(name=dict(type="str", required=True), url=dict(type="str", required=True))),
            pid_file=dict(type="path", default="/run/npuops/npu-exporter.pid"),
            log_file=dict(type="path", default="/run/npuops/npu-exporter.log"),
            wait_timeout=dict(type="int", default=20),
            containers=dict(type="list", elements="str", default=[]),
            container_engine=container.ENGINE_OPTION,
        ),
        required_if=[("state", "started", ("address",))],
        supports_check_mode=True,
    )
    p = module.params
    files = [] if p["state"] == "stopped" else npu_exporter.install(p["install_dir"], check_mode=module.check_mode)
    cli = (module.get_bin_path(p["container_engine"]) or p["container_engine"]) if p["containers"] else None
    argv = npu_exporter.command_line(p["python"], p["install_dir"], p["address"], p["port"], p["npu_smi_path"],
                                     p["hccn_tool_path"], p["timeout"], p["interval"], p["probes"], p["containers"],
                                     cli) if p["address"] and p["state"] != "stopped" else []
    if p["state"] == "installed":
        module.exit_json(changed=bool(files), files=files, action="none", **({"argv": argv} if argv else {}))
    running = daemon.status(p["pid_file"])
    if files and running and p["state"] == "started" and not module.check_mode:
        daemon.stop(running)  # new code: the converge below starts it again
    result = daemon.converge(argv, p["pid_file"], p["log_file"], state=p["state"], check_mode=module.check_mode)
    action = "restarted" if files and running and result["action"] == "started" else result["action"]
    out = {"changed": bool(files) or result["changed"], "action": action, "files": files}
    if result["record"]:
        out["pid"] = result["record"]["pid"]
    if p["state"] == "started":
        out["argv"] = argv
        out["url"] = "http://%s:%d/metrics" % (p["address"], p["port"])
        if action in ("started", "restarted") and not module.check_mode:
            ok, why = daemon.wait_http(out["url"], p["wait_timeout"])
            if not ok:
                module.fail_json(msg="the NPU exporter did not answer at %s within %ss (%s); its log: %s"
                                 % (out["url"], p["wait_timeout"], why, daemon.log_tail(p["log_file"])), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
