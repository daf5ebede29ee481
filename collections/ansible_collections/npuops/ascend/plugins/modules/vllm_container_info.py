#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_container_info
short_description: The state of the service's containers on a node (docker, podman or isula)
version_added: 0.1.0
description:
  - Inspects the named containers and returns, for each, whether it exists, runs, since when, its exit code, its
    npuops labels and whether npuops made it (the config label), plus the last log lines of one that is not
    running.
  - Every call of the container CLI is bounded by O(command_timeout); a wedged daemon fails the task naming the
    call.
author:
  - npuops maintainers (@npuops)
extends_documentation_fragment:
  - npuops.ascend.container_engine
options:
  names:
    description: Container names.
    type: list
    elements: str
    required: true
  log_lines:
    description: Lines of log to return for a container that exists but does not run.
    type: int
    default: 20
  command_timeout:
    description: Seconds each call of the container CLI may take.
    type: int
    default: 15
  read_images:
    description:
      - Also read, for each running container, what its image holds - the registry digest and the versions of vllm,
        vllm_ascend, torch_npu, torch and CANN from the package metadata (a throw-away container of the image,
        C(--network none), no engine started) - once per image id, each call bounded by O(command_timeout).
    type: bool
    default: false
attributes:
  check_mode:
    description: Runs in check mode; it only reads.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
seealso:
  - module: npuops.ascend.vllm_container
"""

EXAMPLES = r"""
- name: What runs on this node
  npuops.ascend.vllm_container_info:
    names: [vllm, vllm-pd-proxy]
    engine: podman
    read_images: true
  register: containers
"""

RETURN = r"""
containers:
  description:
    - One entry per name; C(spec) is what npuops ran the container with (image, command, env, devices, mounts,
      shm_size, privileged, labels; secrets as keyed digests only), V(null) for a container npuops did not make.
  returned: always
  type: dict
  sample:
    vllm: {exists: true, running: true, status: running, exit_code: 0, started_at: "2026-12-01T09:00:00Z",
           ours: true, labels: {io.npuops.role: leader}, id: 5f1c..., log: "",
           spec: {image: "quay.io/ascend/vllm-ascend:v0.23.0-a3", command: [vllm, serve, ...], env: {}, mounts: []},
           image: {id: "sha256:9a1f...", digest: "sha256:4c2e...", error: null,
                   versions: {vllm: 0.23.0, vllm_ascend: 0.23.0, torch_npu: 2.9.0, torch: 2.9.0, cann: 9.1.0}}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import container as ct
from ansible_collections.npuops.ascend.plugins.module_utils import image_probe, proc


def main():
    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type="list", elements="str", required=True),
            engine=ct.ENGINE_OPTION,
            log_lines=dict(type="int", default=20),
            command_timeout=dict(type="int", default=15),
            read_images=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    cli = module.get_bin_path(p["engine"])
    if not cli:
        module.fail_json(msg="%s is not installed on this node" % p["engine"])
    engine = ct.Engine(cli, timeout=p["command_timeout"])
    reads = {}  # image id -> what it holds: read once however many containers run it

    def read_image(image_id):
        if image_id not in reads:
            reads[image_id] = image_probe.read(proc.run, cli, image_id, p["command_timeout"])
        return dict((k, reads[image_id][k]) for k in ("id", "digest", "versions", "error"))

    try:
        found = dict((name, ct.describe_container(engine, name, p["log_lines"], read_image if p["read_images"] else None))
                     for name in p["names"])
    except ct.ContainerError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, containers=found)


if __name__ == "__main__":
    main()
