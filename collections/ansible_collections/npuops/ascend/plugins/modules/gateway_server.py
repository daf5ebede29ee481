#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gateway_server
short_description: Take a server of the HAProxy gateway out of rotation, or put it back
version_added: 0.1.0
description:
  - Talks to HAProxy's admin socket on the gateway host. O(state=drain) stops new requests to the server while
    the ones in flight finish; with O(wait) it returns once the server has no session left (bounded by
    O(timeout)). O(state=maint) takes it out entirely (no health checks either). O(state=ready) puts it back;
    with O(wait) it returns once its health check passes (status UP).
  - A rolling update drains an instance's servers on every gateway host, restarts the instance, validates it
    directly and puts it back.
author:
  - npuops maintainers (@npuops)
options:
  backend:
    description: The HAProxy backend (C(be_service), or C(be_<instance>) in tenant mode).
    type: str
    required: true
  server:
    description: The server's name in the backend (C(<instance>-<n>)).
    type: str
    required: true
  state:
    description: The admin state the server should have.
    type: str
    choices: [ready, drain, maint]
    required: true
  wait:
    description: Wait until a drained server is idle, or a ready one is UP.
    type: bool
    default: true
  timeout:
    description: Seconds the wait may take; the module fails after that, naming the server and its sessions.
    type: int
    default: 60
  socket:
    description: HAProxy's admin socket.
    type: path
    default: /run/haproxy/admin.sock
  state_file:
    description:
      - HAProxy's server-state file (C(server-state-file) in haproxy.cfg), written again after a change so that the
        server keeps its admin state when HAProxy reloads or restarts (a drained server stays out). Empty to leave
        it alone.
    type: path
    default: /var/lib/npuops/haproxy-server-state
attributes:
  check_mode:
    description: Reports whether the state would change; changes nothing.
    support: full
  diff_mode:
    description: No diff.
    support: none
"""

EXAMPLES = r"""
- name: Drain instance a's server (in-flight requests finish, for at most 120 s)
  npuops.ascend.gateway_server:
    backend: be_service
    server: a-1
    state: drain
    timeout: 120

- name: Put it back and wait for its health check
  npuops.ascend.gateway_server:
    backend: be_service
    server: a-1
    state: ready
"""

RETURN = r"""
previous:
  description: The admin state before (ready, drain, maint).
  type: str
  returned: always
  sample: ready
status:
  description: The server's status at the end, as HAProxy's show stat has it.
  type: str
  returned: always
  sample: DRAIN
sessions:
  description: Its current sessions at the end.
  type: int
  returned: always
  sample: 0
waited:
  description: Seconds spent waiting.
  type: float
  returned: always
  sample: 1.4
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import haproxy_admin


def main():
    module = AnsibleModule(
        argument_spec=dict(backend=dict(type="str", required=True), server=dict(type="str", required=True),
                           state=dict(type="str", required=True, choices=list(haproxy_admin.STATES)),
                           wait=dict(type="bool", default=True), timeout=dict(type="int", default=60),
                           socket=dict(type="path", default=haproxy_admin.ADMIN_SOCKET),
                           state_file=dict(type="path", default=haproxy_admin.STATE_FILE)),
        supports_check_mode=True)
    p = module.params
    try:
        info = haproxy_admin.server(p["socket"], p["backend"], p["server"])
        previous = haproxy_admin.state_of(info["status"])
        changed = previous != p["state"]
        waited = 0.0
        if module.check_mode:
            module.exit_json(changed=changed, previous=previous, status=info["status"], sessions=info["scur"],
                             waited=waited)
        if changed:
            haproxy_admin.set_state(p["socket"], p["backend"], p["server"], p["state"])
            if p["state_file"]:
                haproxy_admin.save_server_state(p["socket"], p["state_file"])
        if p["wait"] and p["state"] in ("drain", "maint"):
            info, waited = haproxy_admin.wait(p["socket"], p["backend"], p["server"], lambda i: i["scur"] == 0,
                                              p["timeout"])
        elif p["wait"] and p["state"] == "ready":
            info, waited = haproxy_admin.wait(p["socket"], p["backend"], p["server"],
                                              lambda i: i["status"].upper().startswith("UP"), p["timeout"])
        else:
            info = haproxy_admin.server(p["socket"], p["backend"], p["server"])
    except (haproxy_admin.AdminError, IOError, OSError) as e:
        module.fail_json(msg="%s: %s" % (p["server"], e))
    module.exit_json(changed=changed, previous=previous, status=info["status"], sessions=info["scur"],
                     waited=round(waited, 2))


if __name__ == "__main__":
    main()
