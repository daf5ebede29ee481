#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: weight_stop
short_description: End the weight servers and copy jobs of a run, or of every earlier run
version_added: 0.2.0
description:
  - Every run of the weights stage has an id. Its servers (M(npuops.ascend.weight_serve)) carry it in their
    command line, its copy jobs (M(npuops.ascend.weight_sync)) record themselves under O(run_dir) while they run.
  - With O(except_run_id), ends every server and copy job on the node that belongs to another run (what an
    interrupted or failed run left behind, servers of older versions included); with O(run_id), exactly that
    run's; with neither, all of them.
  - Copy jobs are ended before servers; each gets SIGTERM (and SIGCONT, so a frozen one acts on it), then
    SIGKILL after a few seconds. A copy job ended this way leaves its C(.part) files for a later run to resume.
author:
  - npuops maintainers (@npuops)
options:
  run_id:
    description: End the servers and jobs of this run only.
    type: str
  except_run_id:
    description: End the servers and jobs of every run but this one.
    type: str
  run_dir:
    description: Where copy jobs record themselves.
    type: path
    default: /run/npuops
attributes:
  check_mode:
    description: Reports what would be ended.
    support: full
  diff_mode:
    description: No diff; RV(stopped) lists what ends.
    support: none
seealso:
  - module: npuops.ascend.weight_serve
  - module: npuops.ascend.weight_sync
"""

EXAMPLES = r"""
- name: End what earlier runs left before this run starts its own
  npuops.ascend.weight_stop:
    except_run_id: "{{ npuops_weights_run_id }}"

- name: End this run's servers and copy jobs
  npuops.ascend.weight_stop:
    run_id: "{{ npuops_weights_run_id }}"
"""

RETURN = r"""
stopped:
  description: What was (in check mode, would be) ended.
  returned: always
  type: list
  elements: dict
  sample: [{"kind": "server", "pid": 4242, "run_id": "5f0c9e1a2b3d", "port": 18090, "root": "/data/models/k3"}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import weight_runs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_id=dict(type="str"),
            except_run_id=dict(type="str"),
            run_dir=dict(type="path", default="/run/npuops"),
        ),
        mutually_exclusive=[("run_id", "except_run_id")],
        supports_check_mode=True,
    )
    p = module.params
    stopped = weight_runs.stop(p["run_dir"], run_id=p["run_id"], except_run_id=p["except_run_id"],
                               check_only=module.check_mode)
    module.exit_json(changed=bool(stopped), stopped=[dict((k, v) for k, v in s.items() if k != "record")
                                                     for s in stopped])


if __name__ == "__main__":
    main()
