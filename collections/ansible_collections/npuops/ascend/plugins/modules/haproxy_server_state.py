#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: haproxy_server_state
short_description: Keep HAProxy's servers out of rotation across a reload
version_added: 0.3.0
description:
  - Writes HAProxy's server state (C(show servers state) on the admin socket) to the file its configuration loads
    at start (C(server-state-file) with C(load-server-state-from-file global)), so that a reload or a restart keeps
    every drained or maintained server out of rotation. Without it HAProxy starts every server ready, and an
    instance taken out for its answers would serve again.
  - Only the servers of O(servers) at the same address and port are kept - a server that moved starts from the
    configuration (HAProxy would otherwise apply the old port of the state line to it).
  - Run right before a reload. M(npuops.ascend.gateway_server) keeps the same file current after every change.
author:
  - npuops maintainers (@npuops)
options:
  servers:
    description: The servers of the configuration about to be loaded.
    type: list
    elements: dict
    required: true
    suboptions:
      backend:
        description: Its backend.
        type: str
        required: true
      server:
        description: Its name.
        type: str
        required: true
      address:
        description: Its address.
        type: str
        required: true
      port:
        description: Its port.
        type: int
        required: true
  path:
    description: The server-state file (root only).
    type: path
    default: /var/lib/npuops/haproxy-server-state
  socket:
    description: HAProxy's admin socket.
    type: path
    default: /run/haproxy/admin.sock
attributes:
  check_mode:
    description: Writes nothing.
    support: full
  diff_mode:
    description: No diff.
    support: none
seealso:
  - module: npuops.ascend.gateway_server
"""

EXAMPLES = r"""
- name: Keep the drained servers drained across the reload
  npuops.ascend.haproxy_server_state:
    servers:
      - {backend: be_service, server: a-1, address: 192.168.100.11, port: 8000}
      - {backend: be_service, server: b-1, address: 192.168.100.15, port: 8000}
"""

RETURN = r"""
kept:
  description: The number of servers whose state the file holds.
  returned: always
  type: int
  sample: 2
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import haproxy_admin


def main():
    module = AnsibleModule(
        argument_spec=dict(
            servers=dict(type="list", elements="dict", required=True, options=dict(
                backend=dict(type="str", required=True), server=dict(type="str", required=True),
                address=dict(type="str", required=True), port=dict(type="int", required=True))),
            path=dict(type="path", default=haproxy_admin.STATE_FILE),
            socket=dict(type="path", default=haproxy_admin.ADMIN_SOCKET),
        ),
        supports_check_mode=True,
    )
    p = module.params
    keep = dict(((s["backend"], s["server"]), "%s:%d" % (s["address"], s["port"])) for s in p["servers"])
    if module.check_mode:
        module.exit_json(changed=False, kept=0)
    try:
        kept = haproxy_admin.save_server_state(p["socket"], p["path"], keep)
    except (haproxy_admin.AdminError, IOError, OSError) as e:
        module.fail_json(msg="the servers' state could not be kept across the reload: %s" % e)
    # bookkeeping of HAProxy's own state, not a change of the gateway
    module.exit_json(changed=False, kept=kept)


if __name__ == "__main__":
    main()
