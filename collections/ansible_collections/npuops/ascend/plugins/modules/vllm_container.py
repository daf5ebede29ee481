#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_container
short_description: Run a vLLM-Ascend container (docker, podman or isula), idempotently
version_added: 0.1.0
description:
  - Desired state of one named container through the C(docker), C(podman) or C(isula) command line.
  - The whole spec (image, command, env, devices, mounts, shm size, network, privileged, labels, restart
    policy) is hashed into a label. An unchanged spec changes nothing and restarts nothing; any difference
    removes the container and runs it again, and C(--diff) shows which fields changed.
  - With O(wait_ready), waits until a URL answers (the engine's C(/health), or its leader's) while the
    container keeps running and the peers it must reach stay reachable; a container that exits, or never
    gets ready within the timeout, fails the task with its exit code and the last lines of its log.
  - Secrets (O(secret_env), for example the API key) appear in no command line, no diff, no label and no log. With
    podman they live in podman's secret store and reach the container as environment (C(--secret ...,type=env)),
    so C(podman inspect) shows the secret's name, not its value. docker (outside swarm) and isula have no secret
    store; there the value reaches the container through an env file readable only by root and removed right
    after, and C(inspect) on the node shows it to root.
  - Labels carry a digest of each secret keyed by a random node-local key (C(/var/lib/npuops)), so a changed
    secret recreates the container while the label reveals nothing that can be tested against guesses.
  - Every call of the container CLI is bounded by O(command_timeout).
author:
  - npuops maintainers (@npuops)
extends_documentation_fragment:
  - npuops.ascend.container_engine
options:
  name:
    description: Container name.
    type: str
    required: true
  state:
    description:
      - V(started), V(stopped) or V(absent).
      - V(ready) changes nothing; it fails unless the container is running (and, with O(wait_ready), until it is
        ready). It is how a deployment waits for containers it already started. In check mode it waits for
        nothing and does not fail for a container that does not exist yet.
    type: str
    choices: [started, stopped, absent, ready]
    default: started
  image:
    description: Image reference (a digest pin is best). Required with O(state=started).
    type: str
  command:
    description: The command and its arguments (argv), e.g. C([vllm, serve, /models/x, --tensor-parallel-size, 16]).
    type: list
    elements: str
    default: []
  env:
    description: Environment variables (shown in diffs and logs).
    type: dict
    default: {}
  secret_env:
    description: Environment variables that are secrets; compared by digest, never shown.
    type: dict
    default: {}
  devices:
    description: Device nodes to pass through (C(/dev/davinci0) ... C(/dev/hisi_hdc)).
    type: list
    elements: str
    default: []
  mounts:
    description: Bind mounts, C(src:dst[:ro]).
    type: list
    elements: str
    default: []
  optional_mounts:
    description:
      - Host paths of O(mounts) that are mounted only where they exist on the node (for example
        C(/etc/hccn.conf)); the others are always mounted. The ones left out are in RV(missing_optional_mounts)
        and are not part of the spec, so the check and the start see the same mounts.
    type: list
    elements: str
    default: []
  shm_size:
    description: Size of C(/dev/shm) in the container, e.g. V(16g).
    type: str
  network:
    description: Network mode; vLLM multi-node needs V(host).
    type: str
    default: host
  privileged:
    description: Run privileged.
    type: bool
    default: false
  labels:
    description: Extra labels.
    type: dict
    default: {}
  restart_policy:
    description: Restart policy (V(no), V(on-failure), V(always), V(unless-stopped)).
    type: str
  recreate:
    description: Remove and run again even when the spec is unchanged.
    type: bool
    default: false
  takeover:
    description:
      - A container named O(name) that npuops did not make (it lacks the config label) is someone else's - an
        operator's own container, another tool's. By default the module refuses to replace, stop or remove it,
        in check mode too, naming it; V(true) lets it act on it as on its own.
    type: bool
    default: false
  wait_ready:
    description:
      - Wait until O(wait_ready.url) answers 2xx, for at most O(wait_ready.timeout) seconds, failing early
        when the container exits or a peer in O(wait_ready.peers) stays unreachable.
      - Without a url it only checks that the container keeps running for O(wait_ready.timeout) seconds.
    type: dict
    suboptions:
      url:
        description: The URL to poll.
        type: str
      timeout:
        description: Seconds to wait at most.
        type: int
        default: 600
      interval:
        description: Seconds between polls.
        type: float
        default: 2
      peers:
        description: C(host:port) endpoints the container must be able to reach (its leader's rendezvous port).
        type: list
        elements: str
        default: []
      unreachable_after:
        description: Seconds a peer may stay unreachable before the wait fails.
        type: float
        default: 15
      missed:
        description:
          - Seconds each peer has already been unreachable in an earlier slice of the same wait (what a timed-out
            wait returns as C(missed)); the waiting action plugin npuops.ascend.serve_wait passes it on.
        type: dict
        default: {}
  command_timeout:
    description: Seconds each call of the container CLI may take (a wedged daemon fails the task, naming the call).
    type: int
    default: 60
  stop_timeout:
    description: Seconds a stopping container gets between SIGTERM and SIGKILL.
    type: int
    default: 30
  secret_dir:
    description: Where the transient env file for O(secret_env) is written (docker and isula).
    type: path
    default: /run/npuops
attributes:
  check_mode:
    description: Reports the action it would take (create, recreate, start, stop, remove) without doing it.
    support: full
  diff_mode:
    description: The managed fields before and after, the command one flag per line (secrets by digest).
    support: full
notes:
  - Only the fields listed above are compared; changing anything else by hand is not detected.
seealso:
  - module: npuops.ascend.weight_sync
"""

EXAMPLES = r"""
- name: The DP leader of a 4-node tier
  npuops.ascend.vllm_container:
    name: vllm
    engine: docker
    image: quay.io/ascend/vllm-ascend:v0.23.0-a3
    command: "{{ npuops_container.command }}"
    env: "{{ npuops_container.env }}"
    devices: "{{ npuops_container.devices }}"
    mounts: "{{ npuops_container.mounts }}"
    shm_size: 16g
    secret_env:
      VLLM_API_KEY: "{{ vault_api_key }}"
    wait_ready:
      url: http://10.0.0.11:8000/health
      timeout: 3600

- name: Stop it
  npuops.ascend.vllm_container:
    name: vllm
    state: stopped
"""

RETURN = r"""
action:
  description: What was (or, in check mode, would be) done.
  returned: always
  type: str
  sample: recreate
changed_fields:
  description: Managed fields that differ from the running container's spec.
  returned: always
  type: list
  elements: str
  sample: [command, env]
changes:
  description: What differs, one line per vLLM flag, environment key, device or mount (secrets as C((secret))).
  returned: always
  type: list
  elements: str
  sample: ["--max-num-seqs: 16 -> 8", "env HCCL_BUFFSIZE: 256 -> 512"]
config_hash:
  description: Hash of the desired spec (the container's label).
  returned: when O(state=started)
  type: str
container_id:
  description: ID of the container.
  returned: when it exists after the task
  type: str
started_at:
  description: When the container started (unchanged when nothing was done).
  returned: when it is running after the task
  type: str
missing_optional_mounts:
  description: The O(optional_mounts) that do not exist on the node, so were not mounted.
  returned: success
  type: list
  elements: str
  sample: [/etc/hccn.conf]
ready_after:
  description: Seconds waited for readiness.
  returned: when O(wait_ready) is set
  type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import container as ct


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["started", "stopped", "absent", "ready"], default="started"),
            engine=ct.ENGINE_OPTION,
            image=dict(type="str"),
            command=dict(type="list", elements="str", default=[]),
            env=dict(type="dict", default={}),
            secret_env=dict(type="dict", default={}, no_log=True),
            devices=dict(type="list", elements="str", default=[]),
            mounts=dict(type="list", elements="str", default=[]),
            optional_mounts=dict(type="list", elements="str", default=[]),
            shm_size=dict(type="str"),
            network=dict(type="str", default="host"),
            privileged=dict(type="bool", default=False),
            labels=dict(type="dict", default={}),
            restart_policy=dict(type="str"),
            recreate=dict(type="bool", default=False),
            takeover=dict(type="bool", default=False),
            wait_ready=dict(type="dict", options=dict(
                url=dict(type="str"),
                timeout=dict(type="int", default=600),
                interval=dict(type="float", default=2),
                peers=dict(type="list", elements="str", default=[]),
                unreachable_after=dict(type="float", default=15),
                missed=dict(type="dict", default={}),
            )),
            command_timeout=dict(type="int", default=60),
            stop_timeout=dict(type="int", default=30),
            secret_dir=dict(type="path", default="/run/npuops"),
        ),
        required_if=[("state", "started", ("image",))],
        supports_check_mode=True,
    )
    p = module.params
    cli = module.get_bin_path(p["engine"])
    if not cli:
        module.fail_json(msg="%s is not installed on this node (set npuops_container_engine to the engine it has)"
                             % p["engine"])
    engine = ct.Engine(cli, timeout=p["command_timeout"])
    spec = dict((k, p[k]) for k in ct.MANAGED)
    spec["env"] = dict((str(k), str(v)) for k, v in spec["env"].items())
    spec["secret_env"] = dict((str(k), str(v)) for k, v in spec["secret_env"].items())
    spec["mounts"], missing = ct.present_mounts(spec["mounts"], p["optional_mounts"])
    try:
        result = ct.converge(engine, p["name"], spec, p["state"], recreate=p["recreate"], wait=p["wait_ready"],
                             check_mode=module.check_mode, secret_dir=p["secret_dir"], stop_timeout=p["stop_timeout"],
                             takeover=p["takeover"])
    except ct.ContainerError as e:
        module.fail_json(msg="%s: %s" % (p["name"], e), **e.extra)
    if not module._diff:
        result.pop("diff", None)
    result["missing_optional_mounts"] = missing
    module.exit_json(**result)


if __name__ == "__main__":
    main()
