#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: npu_facts
short_description: Discover the Ascend NPUs of a node with npu-smi
version_added: 0.1.0
description:
  - Runs C(npu-smi info), C(npu-smi info -m) and C(npu-smi info -t board) and reads the driver
    C(version.info) and the CANN C(ascend_toolkit_install.info).
  - Returns the chips with their card, chip, logical and physical ids, bus id, health, HBM use,
    power and temperature, the processes using NPUs, and the driver, firmware and CANN versions.
  - The card/chip to logical/physical id map comes from C(npu-smi info -m), never from arithmetic;
    NPU ids need not start at 0. Tables are parsed by header and pattern, not by column offsets,
    so the widened npu-smi 26 tables parse too.
author:
  - npuops maintainers (@npuops)
options:
  npu_smi_path:
    description:
      - Path of C(npu-smi). By default it is looked up on E(PATH), then in C(/usr/local/bin) and C(/usr/local/sbin).
    type: path
  driver_dir:
    description:
      - Where the Ascend driver is installed; its C(version.info) gives O(driver_dir)'s version.
    type: path
    default: /usr/local/Ascend/driver
  toolkit_dir:
    description:
      - The CANN toolkit directory whose C(<arch>-linux/ascend_toolkit_install.info) gives the CANN version.
      - When it is absent the CANN version is reported as V(null) (vLLM-Ascend images bring their own CANN).
    type: path
    default: /usr/local/Ascend/ascend-toolkit/latest
  timeout:
    description:
      - Seconds each C(npu-smi) call may take. A wedged driver makes npu-smi block forever; the module then fails
        naming the call instead of hanging the play.
    type: int
    default: 30
attributes:
  check_mode:
    description: Runs in check mode; it only reads.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
  facts:
    description: Returns C(ansible_facts.npu).
    support: full
notes:
  - Fails with the npu-smi message when npu-smi is missing or prints C(dcmi module initialize failed)
    (the driver is not loaded, or a device did not start).
seealso:
  - module: npuops.ascend.hccn_check
"""

EXAMPLES = r"""
- name: Discover the NPUs
  npuops.ascend.npu_facts:

- name: Every chip must be healthy
  ansible.builtin.assert:
    that: ansible_facts.npu.chips | rejectattr('health', 'eq', 'OK') | list | length == 0
    fail_msg: "{{ inventory_hostname }}: unhealthy chips {{ ansible_facts.npu.chips | rejectattr('health', 'eq', 'OK') }}"

- name: npu-smi in a non-standard place
  npuops.ascend.npu_facts:
    npu_smi_path: /opt/ascend/bin/npu-smi
"""

RETURN = r"""
ansible_facts:
  description: The NPU facts.
  returned: success
  type: dict
  contains:
    npu:
      description: What the node's NPUs are and how they are doing.
      type: dict
      contains:
        generation:
          description: V(A3) when cards have two chips (910C), V(A2) when one (910B).
          type: str
          sample: A3
        chip_model:
          description: The chip name npu-smi prints.
          type: str
          sample: Ascend910
        soc:
          description: The SoC string derived from the board's NPU name, when npu-smi reports it.
          type: str
          sample: Ascend910_9392
        card_count:
          description: Number of NPU cards.
          type: int
          sample: 8
        chips_per_card:
          description: Compute chips (dies) per card.
          type: int
          sample: 2
        chip_count:
          description: Number of compute chips (logical devices).
          type: int
          sample: 16
        npu_smi_version:
          description: Version printed in the npu-smi table header.
          type: str
          sample: 25.5.1
        driver_version:
          description: C(Version) from the driver's C(version.info).
          type: str
          sample: 25.5.1
        firmware_version:
          description: C(Firmware Version) from C(npu-smi info -t board).
          type: str
          sample: 7.8.0.6.201
        cann_version:
          description: CANN toolkit version, V(null) when no toolkit is installed on the host.
          type: str
          sample: 9.1.0
        chips:
          description: One entry per compute chip, ordered by logical id.
          type: list
          elements: dict
          sample:
            - card: 0
              chip: 0
              logic_id: 0
              phy_id: 0
              bus_id: "0000:9D:00.0"
              health: OK
              hbm_used_mb: 3397
              hbm_total_mb: 65536
              power_w: 178.8
              temp_c: 36
              name: Ascend910
        processes:
          description: Processes using NPUs (the PID may be empty-named inside containers).
          type: list
          elements: dict
          sample:
            - card: 2
              chip: 0
              pid: 2268921
              name: python3
              memory_mb: 58959
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import npu_smi


def main():
    module = AnsibleModule(
        argument_spec=dict(
            npu_smi_path=dict(type="path"),
            driver_dir=dict(type="path", default=npu_smi.DRIVER_DIR),
            toolkit_dir=dict(type="path", default=npu_smi.TOOLKIT_DIR),
            timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    try:
        tool = npu_smi.locate(module.get_bin_path, module.params["npu_smi_path"])
        facts = npu_smi.discover(npu_smi.runner(tool, module.params["timeout"]), module.params["driver_dir"],
                                 module.params["toolkit_dir"])
    except npu_smi.NpuSmiError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, ansible_facts={"npu": facts})


if __name__ == "__main__":
    main()
