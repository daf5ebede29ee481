#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: diagnose_collect
short_description: Collect what a node says about a failed start, a dead rank or a down instance
version_added: 0.1.0
description:
  - Reads, within O(budget) seconds whatever is broken, the log of each named container since its last start (each
    line with the time the engine wrote it), the CANN log files (plog, device logs) under O(log_dirs) written since
    then, the NPU driver's kernel messages, and the facts that tell causes apart - the containers' network
    variables, the node's addresses, the TLS switch and link of every device (hccn_tool) - plus the node's clock
    and every chip whose health (C(npu-smi info)) is not OK.
  - When MindCluster FaultDiag (C(ascend-fd)) is installed on the node, its verdict too (C(ascend-fd single-diag) on
    the CANN logs and the engines' logs), in RV(ascend_fd).
  - The controller matches them against the signatures (filter P(npuops.ascend.diagnose_findings#filter)).
  - Only reads; nothing on the node changes.
author:
  - npuops maintainers (@npuops)
extends_documentation_fragment:
  - npuops.ascend.container_engine
options:
  names:
    description: The service's containers on this node.
    type: list
    elements: str
    default: []
  tail:
    description: At most this many lines of each container's log (its last start).
    type: int
    default: 3000
  log_dirs:
    description: Directories of CANN log files on the node (the containers' ASCEND_PROCESS_LOG_PATH, mounted).
    type: list
    elements: path
    default: []
  devices:
    description: Physical NPU ids whose TLS switch and link are read.
    type: list
    elements: int
    default: []
  hccn_tool:
    description: Path of hccn_tool (default found in PATH or the driver's tools directory).
    type: path
  npu_smi_path:
    description: Path of C(npu-smi) (default found in E(PATH), then C(/usr/local/bin) and C(/usr/local/sbin)).
    type: path
  ascend_fd:
    description:
      - Path of MindCluster FaultDiag's C(ascend-fd). By default found in E(PATH); V(false) or an empty string
        skips it.
    type: str
  budget:
    description: Seconds the whole collection may take; what is left unread is named in RV(errors).
    type: int
    default: 40
attributes:
  check_mode:
    description: Runs in check mode; it only reads.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
seealso:
  - module: npuops.ascend.vllm_container_info
"""

EXAMPLES = r"""
- name: What this node says about the failure
  npuops.ascend.diagnose_collect:
    names: [vllm]
    engine: docker
    devices: "{{ range(16) | list }}"
  register: collected
"""

RETURN = r"""
clock:
  description: The node's clock when it was read (seconds since the epoch), for the offsets between nodes.
  returned: always
  type: float
sources:
  description: What was read, one entry per source (a container log, a log file, the kernel messages).
  returned: always
  type: list
  elements: dict
  sample: [{source: container vllm, text: "2026-12-05T01:02:03.1Z INFO 12-05 01:02:03 [core.py:61] ..."}]
facts:
  description: env (per container - HCCL_IF_IP, HCCL_SOCKET_IFNAME, ...), addresses ({nic - [ipv4]}), tls and links
    ({device - value}).
  returned: always
  type: dict
ascend_fd:
  description: MindCluster FaultDiag's verdict when C(ascend-fd) is installed - C(verdicts), one per fault event
    (code, cause, suggestion, devices, evidence, time), or C(error).
  returned: when ascend-fd is installed
  type: dict
  sample: {verdicts: [{code: AISW_CANN_HCCL_01, cause: "...", suggestion: "...", devices: [worker-0 device-2],
                       evidence: "[ERROR] HCCL(...)", time: "2026-05-29 15:35:10.674067"}]}
errors:
  description: What could not be read (a wedged container daemon, the budget spent).
  returned: always
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import container as ct
from ansible_collections.npuops.ascend.plugins.module_utils import diagnose, npu_smi, proc

HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type="list", elements="str", default=[]),
            engine=ct.ENGINE_OPTION,
            tail=dict(type="int", default=3000),
            log_dirs=dict(type="list", elements="path", default=[]),
            devices=dict(type="list", elements="int", default=[]),
            hccn_tool=dict(type="path"),
            npu_smi_path=dict(type="path"),
            ascend_fd=dict(type="str"),
            budget=dict(type="int", default=40),
        ),
        supports_check_mode=True,
    )
    p = module.params
    cli = module.get_bin_path(p["engine"])
    if not cli:
        module.fail_json(msg="%s is not installed on this node" % p["engine"])
    tool = p["hccn_tool"] or module.get_bin_path("hccn_tool") or (HCCN_TOOL if os.path.exists(HCCN_TOOL) else None)
    engine = ct.Engine(cli, timeout=min(15, max(1, p["budget"] // 3)))
    try:
        smi = npu_smi.locate(module.get_bin_path, p["npu_smi_path"])
    except npu_smi.NpuSmiError:
        smi = None  # a gateway or monitor host: no chips to read
    fd = p["ascend_fd"]
    fd = None if fd in ("", "false", "False", "no") else (fd or module.get_bin_path("ascend-fd"))
    result = diagnose.collect(engine, p["names"], proc.run, tail=p["tail"], log_dirs=p["log_dirs"], hccn_tool=tool,
                              devices=p["devices"], budget=float(p["budget"]), npu_smi=smi, ascend_fd=fd)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
