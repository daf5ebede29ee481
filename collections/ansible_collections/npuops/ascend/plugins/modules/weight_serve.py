#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: weight_serve
short_description: Serve a model directory to peers, read-only, for the weight copy
version_added: 0.1.0
description:
  - Starts a small HTTP/1.1 server in the background that serves the model directory's manifest and only
    the files it lists (anything else, C(..), absolute paths, symlinks out of the directory answer 404), to
    requests that carry O(token). Supports Range requests and sends file bodies with C(sendfile).
  - A node that is still receiving weights serves each piece as soon as it arrived and passed its check,
    which lets the nodes relay the weights in a pipelined chain.
  - The server exits by itself after O(idle_timeout) seconds without requests; O(state=stopped) stops it.
  - "Idempotent: a server already running with the same directory, address, port and token is left alone."
author:
  - npuops maintainers (@npuops)
options:
  path:
    description: The model directory to serve; created when missing (a relay serves what arrives).
    type: path
    required: true
  bind:
    description:
      - The one address to listen on, normally the node's address on the fast network (npuops_fabric_ip).
      - There is no default; V(0.0.0.0) is accepted but serves on every network of the node.
    type: str
  port:
    description: TCP port.
    type: int
    default: 18090
  token:
    description: The secret clients must present (C(Authorization Bearer)). Never logged.
    type: str
  idle_timeout:
    description: Seconds without requests after which the server exits.
    type: int
    default: 600
  run_id:
    description:
      - The id of the run that starts the server; it is in the server's command line, so that a later run can
        end it (M(npuops.ascend.weight_stop)). Not a secret.
    type: str
    default: ""
  state:
    description: V(started) or V(stopped).
    type: str
    choices: [started, stopped]
    default: started
  run_dir:
    description: Where the server's script, identity file and log live on the node.
    type: path
    default: /run/npuops
attributes:
  check_mode:
    description: Reports whether it would start or stop a server.
    support: full
  diff_mode:
    description: No diff.
    support: none
notes:
  - The token reaches the server through a file readable only by root, which the server deletes on start,
    so it never appears in C(ps) or in a log.
seealso:
  - module: npuops.ascend.weight_sync
"""

EXAMPLES = r"""
- name: Serve the weights on the fast network
  npuops.ascend.weight_serve:
    path: /data/models/Kimi-K3-W4A8
    bind: "{{ npuops_fabric_ip }}"
    token: "{{ weights_token }}"
  register: served

- name: Stop it
  npuops.ascend.weight_serve:
    path: /data/models/Kimi-K3-W4A8
    port: 18090
    state: stopped
"""

RETURN = r"""
url:
  description: Where peers reach the server.
  returned: when O(state=started)
  type: str
  sample: http://10.214.0.100:18090
pid:
  description: PID of the server process.
  returned: when O(state=started)
  type: int
log:
  description: The server's log file (requests refused, idle exit; never the token).
  returned: always
  type: str
"""

import hashlib
import inspect
import json
import os
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import proc, weight_server


def files(run_dir, port):
    base = os.path.join(run_dir, "weight_serve-%d" % port)
    return {"state": base + ".json", "log": base + ".log", "token": base + ".token",
            "script": os.path.join(run_dir, weight_server.SCRIPT_NAME)}


def running(state_path, script):
    """The recorded server, if its PID is alive and really is our server; else None."""
    try:
        with open(state_path) as f:
            state = json.load(f)
        with open("/proc/%d/cmdline" % state["pid"], "rb") as f:
            cmdline = f.read().split(b"\0")
    except (IOError, OSError, ValueError, KeyError):
        return None
    if script.encode() not in cmdline or str(state.get("port")).encode() not in cmdline:
        return None
    return state


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            bind=dict(type="str"),
            port=dict(type="int", default=18090),
            token=dict(type="str", no_log=True),
            idle_timeout=dict(type="int", default=600),
            run_id=dict(type="str", default=""),
            state=dict(type="str", choices=["started", "stopped"], default="started"),
            run_dir=dict(type="path", default="/run/npuops"),
        ),
        required_if=[("state", "started", ("bind", "token"))],
        supports_check_mode=True,
    )
    p = module.params
    paths = files(p["run_dir"], p["port"])
    current = running(paths["state"], paths["script"])
    if p["state"] == "stopped":
        if current and not module.check_mode:
            proc.end([current["pid"]])
            os.unlink(paths["state"])
        module.exit_json(changed=current is not None, log=paths["log"])

    if not os.path.isdir(p["path"]) and not module.check_mode:
        # a relay serves what arrives: its directory may not exist before its own copy starts
        os.makedirs(p["path"], 0o755)
    wanted = {"root": os.path.realpath(p["path"]), "bind": p["bind"], "port": p["port"],
              "token_sha256": hashlib.sha256(p["token"].encode()).hexdigest(), "idle_timeout": p["idle_timeout"],
              "run_id": p["run_id"]}
    url = "http://%s:%d" % (p["bind"], p["port"])
    if current and all(current.get(k) == v for k, v in wanted.items()):
        module.exit_json(changed=False, url=url, pid=current["pid"], log=paths["log"])
    if module.check_mode:
        module.exit_json(changed=True, url=url, log=paths["log"])
    if current:
        proc.end([current["pid"]])
    if not os.path.isdir(p["run_dir"]):
        os.makedirs(p["run_dir"], 0o700)
    with open(paths["script"], "w") as f:
        f.write(inspect.getsource(weight_server))
    fd = os.open(paths["token"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(p["token"])
    pid, error = weight_server.launch(sys.executable, paths["script"], p["path"], p["bind"], p["port"], paths["token"],
                                      p["idle_timeout"], paths["log"], run_id=p["run_id"])
    if pid is None:
        module.fail_json(msg="the weight server did not start on %s:%d: %s" % (p["bind"], p["port"], error))
    with open(paths["state"], "w") as f:
        json.dump(dict(wanted, pid=pid), f)
    module.exit_json(changed=True, url=url, pid=pid, log=paths["log"])


if __name__ == "__main__":
    main()
