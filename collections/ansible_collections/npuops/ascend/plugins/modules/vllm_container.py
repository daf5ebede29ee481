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
  - Secrets (O(secret_env), for example the API key) reach the container through an env file readable only
    by root and removed right after, so they appear in no command line, no diff and no log.
author:
  - npuops maintainers (@npuops)
options:
  name:
    description: Container name.
    type: str
    required: true
  state:
    description:
      - V(started), V(stopped) or V(absent).
      - V(ready) changes nothing; it fails unless the container is running (and, with O(wait_ready), until it is
        ready). It is how a deployment waits for containers it already started.
    type: str
    choices: [started, stopped, absent, ready]
    default: started
  engine:
    description: The container CLI.
    type: str
    choices: [docker, podman, isula]
    default: docker
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
  secret_dir:
    description: Where the transient env file for O(secret_env) is written.
    type: path
    default: /run/npuops
attributes:
  check_mode:
    description: Reports the action it would take (create, recreate, start, stop, remove) without doing it.
    support: full
  diff_mode:
    description: The managed fields before and after (secrets by digest).
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
ready_after:
  description: Seconds waited for readiness.
  returned: when O(wait_ready) is set
  type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import container as ct


def wait_ready(engine, name, options):
    return ct.wait_ready(engine, name, options["url"], options["timeout"], options["interval"], options["peers"],
                         options["unreachable_after"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", choices=["started", "stopped", "absent", "ready"], default="started"),
            engine=dict(type="str", choices=["docker", "podman", "isula"], default="docker"),
            image=dict(type="str"),
            command=dict(type="list", elements="str", default=[]),
            env=dict(type="dict", default={}),
            secret_env=dict(type="dict", default={}, no_log=True),
            devices=dict(type="list", elements="str", default=[]),
            mounts=dict(type="list", elements="str", default=[]),
            shm_size=dict(type="str"),
            network=dict(type="str", default="host"),
            privileged=dict(type="bool", default=False),
            labels=dict(type="dict", default={}),
            restart_policy=dict(type="str"),
            recreate=dict(type="bool", default=False),
            wait_ready=dict(type="dict", options=dict(
                url=dict(type="str"),
                timeout=dict(type="int", default=600),
                interval=dict(type="float", default=2),
                peers=dict(type="list", elements="str", default=[]),
                unreachable_after=dict(type="float", default=15),
            )),
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
    engine = ct.Engine(cli, module.run_command)
    name = p["name"]
    spec = dict((k, p[k]) for k in ct.MANAGED)
    spec["env"] = dict((str(k), str(v)) for k, v in spec["env"].items())
    result = dict(changed=False, action="none", changed_fields=[])
    try:
        info = engine.inspect(name)
        current = engine.state(info) if info else None
        if p["state"] == "absent":
            if current:
                result.update(changed=True, action="remove")
                if not module.check_mode:
                    engine.remove(name)
            module.exit_json(**result)
        if p["state"] == "ready":
            if not current:
                module.fail_json(msg="%s: there is no such container" % name, **result)
            if p["wait_ready"]:
                result["ready_after"] = wait_ready(engine, name, p["wait_ready"])
            elif not current["running"]:
                raise ct.ContainerError("exited with code %s; last log lines:\n%s" % (current["exit_code"],
                                                                                      engine.logs(name)))
            st = engine.state(engine.inspect(name))
            result.update(container_id=st["id"], started_at=st["started_at"])
            module.exit_json(**result)
        if p["state"] == "stopped":
            if current and current["running"]:
                result.update(changed=True, action="stop")
                if not module.check_mode:
                    engine.stop(name)
            if current:
                result["container_id"] = current["id"]
            module.exit_json(**result)

        wanted = ct.config_hash(spec)
        result["config_hash"] = wanted
        after = ct.public_spec(spec)
        if current is None:
            action = "create"
            fields = list(ct.MANAGED)
        elif current["hash"] != wanted or p["recreate"]:
            action = "recreate"
            fields = ct.differences(current["spec"], after) if current["spec"] else ["(unknown: not made by npuops)"]
        elif not current["running"]:
            action = "start"
            fields = []
        else:
            action = "none"
            fields = []
        result.update(changed=action != "none", action=action, changed_fields=fields)
        if module._diff and action in ("create", "recreate"):
            result["diff"] = {"before": (current or {}).get("spec") or {}, "after": after}
        if module.check_mode:
            module.exit_json(**result)
        if action == "recreate":
            engine.remove(name)
        if action in ("create", "recreate"):
            engine.create(name, spec, p["secret_dir"])
        elif action == "start":
            engine.start(name)
        if p["wait_ready"]:
            result["ready_after"] = wait_ready(engine, name, p["wait_ready"])
        st = engine.state(engine.inspect(name))
        result.update(container_id=st["id"], started_at=st["started_at"])
    except ct.ContainerError as e:
        result.update(e.extra)
        module.fail_json(msg="%s: %s" % (name, e), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
