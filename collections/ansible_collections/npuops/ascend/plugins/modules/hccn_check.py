#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hccn_check
short_description: Check the NPU network devices of a node with hccn_tool, and ping peers from each device
version_added: 0.1.0
description:
  - For every physical device, reads link, net_health, ipaddr/netmask, the A3 vNIC, the TLS switch,
    the gateway and the netdetect address with C(hccn_tool -i <phy> -<item> -g).
  - With O(ping_targets), pings peers from each device (C(-hccs_ping) where the board supports it,
    C(-ping) otherwise) and returns the result matrix.
  - Devices are checked in parallel; each device runs one ping at a time, as hccn_tool requires.
    Every command has a timeout and the whole check a time budget (O(timeout)).
  - Never changes anything. Each failure is returned as C({check, phy_id, observed, expected, fix}).
author:
  - npuops maintainers (@npuops)
options:
  hccn_tool_path:
    description: Path of C(hccn_tool).
    type: path
    default: /usr/local/Ascend/driver/tools/hccn_tool
  devices:
    description:
      - Physical device ids to check. By default all devices that C(npu-smi info -m) lists.
    type: list
    elements: int
  npu_smi_path:
    description: Path of C(npu-smi), used only to find the devices when O(devices) is not given.
    type: path
  ping_targets:
    description:
      - What to ping. Each element is either an address, pinged from every device, or a dict with
        C(device) (physical id) and C(address), pinged from that device only.
    type: list
    elements: raw
    default: []
  ping_method:
    description:
      - V(auto) uses C(-hccs_ping) where the board supports it (A3 SuperPoD) and C(-ping) otherwise.
    type: str
    choices: [auto, ping, hccs_ping]
    default: auto
  timeout:
    description: Time budget of the whole check in seconds; pings not run within it are reported as failed.
    type: int
    default: 120
  fail_on_error:
    description: Fail the task when a check failed. By default the failures are only returned.
    type: bool
    default: false
attributes:
  check_mode:
    description: Runs in check mode; it only reads and pings.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
notes:
  - Needs root, as hccn_tool does.
seealso:
  - module: npuops.ascend.npu_facts
"""

EXAMPLES = r"""
- name: Check every device of the node
  npuops.ascend.hccn_check:

- name: Ping two peers from every device and fail on any problem
  npuops.ascend.hccn_check:
    ping_targets: [10.214.1.1, 10.214.2.1]
    fail_on_error: true

- name: Ping a planned mesh (one peer per device)
  npuops.ascend.hccn_check:
    devices: [0, 1]
    ping_targets:
      - {device: 0, address: 10.214.1.1}
      - {device: 1, address: 10.214.2.2}
"""

RETURN = r"""
ok:
  description: V(true) when no check failed.
  returned: always
  type: bool
ping_method:
  description: The hccn_tool ping item used.
  returned: always
  type: str
  sample: ping
devices:
  description: The state of each device.
  returned: always
  type: list
  elements: dict
  sample:
    - phy_id: 0
      link: UP
      net_health: Success
      ipaddr: 10.214.0.1
      netmask: 255.255.240.0
      vnic_ipaddr: 10.214.0.128
      tls_switch: 0
      gateway: 10.214.15.254
      netdetect: 10.214.15.254
ping:
  description: One row per ping.
  returned: always
  type: list
  elements: dict
  sample:
    - phy_id: 0
      target: 10.214.1.1
      ok: true
      loss_pct: 0.0
      rtt_ms: 0.105
      method: ping
      detail: 3/3 received
failed_checks:
  description: Every failed check, with what was seen, what was expected and how to fix it.
  returned: always
  type: list
  elements: dict
  sample:
    - check: link
      phy_id: 7
      observed: "link status: DOWN"
      expected: "link status: UP"
      fix: check the optical module, the cable and the switch port of device 7
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import hccn, npu_smi


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hccn_tool_path=dict(type="path", default=hccn.DEFAULT_HCCN_TOOL),
            devices=dict(type="list", elements="int"),
            npu_smi_path=dict(type="path"),
            ping_targets=dict(type="list", elements="raw", default=[]),
            ping_method=dict(type="str", choices=["auto", "ping", "hccs_ping"], default="auto"),
            timeout=dict(type="int", default=120),
            fail_on_error=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    tool = module.params["hccn_tool_path"]
    if not os.path.exists(tool):
        module.fail_json(msg="hccn_tool not found at %s: it comes with the Ascend driver "
                             "(driver/tools/hccn_tool); set hccn_tool_path if it lives elsewhere" % tool)
    devices = module.params["devices"]
    if not devices:
        try:
            call = npu_smi.runner(npu_smi.locate(module.get_bin_path, module.params["npu_smi_path"]), 30)
            devices = sorted(c["phy_id"] for c in npu_smi.parse_mapping(call("info", "-m")))
        except npu_smi.NpuSmiError as e:
            module.fail_json(msg="no devices given, and listing them failed: %s" % e)
    targets = {}
    for item in module.params["ping_targets"]:
        if isinstance(item, dict):
            if "device" not in item or "address" not in item:
                module.fail_json(msg="ping_targets entries that are dicts need device and address, got %r" % (item,))
            targets.setdefault(int(item["device"]), []).append(str(item["address"]))
        else:
            for phy in devices:
                targets.setdefault(phy, []).append(str(item))
    unknown = sorted(set(targets) - set(devices))
    if unknown:
        module.fail_json(msg="ping_targets name devices %s that are not checked (devices: %s)" % (unknown, devices))

    devs, rows, problems, method = hccn.check(hccn.run_command, tool, devices, targets,
                                              ping_method=module.params["ping_method"],
                                              budget=float(module.params["timeout"]))
    result = dict(changed=False, ok=not problems, ping_method=method, devices=devs, ping=rows,
                  failed_checks=problems)
    if problems and module.params["fail_on_error"]:
        module.fail_json(msg="%d hccn check(s) failed: %s" % (len(problems), "; ".join(
            "device %s %s: %s" % (p["phy_id"], p["check"], p["observed"]) for p in problems[:10])), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
