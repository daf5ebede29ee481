#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gateway_info
short_description: What a gateway host serves - HAProxy, keepalived, the floating address and the rotation
version_added: 0.1.0
description:
  - Reads, on a gateway host, whether HAProxy and keepalived run (their pid files), whether this host holds the
    floating address O(vip), and every server of every HAProxy backend with its status (UP, DOWN, DRAIN, MAINT, ...)
    and admin state (ready, drain, maint), from HAProxy's admin socket.
  - Changes nothing. Status reports an instance out of rotation from it; a rolling update reads it before it drains
    an instance (it never drains the last one in rotation) and puts back an instance an interrupted update left out.
author:
  - npuops maintainers (@npuops)
options:
  vip:
    description: The floating address (the service's endpoint); RV(vip_held) says whether this host holds it.
    type: str
  socket:
    description: HAProxy's admin socket.
    type: path
    default: /run/haproxy/admin.sock
  haproxy_pid_file:
    description: HAProxy's pid file (its master's pid).
    type: path
    default: /run/haproxy.pid
  keepalived_pid_file:
    description: keepalived's pid file.
    type: path
    default: /run/keepalived.pid
  timeout:
    description: Seconds the admin socket may take to answer.
    type: float
    default: 5
attributes:
  check_mode:
    description: Reads only; runs in check mode too.
    support: full
  diff_mode:
    description: No diff.
    support: none
"""

EXAMPLES = r"""
- name: Read the gateway host's state
  npuops.ascend.gateway_info:
    vip: 192.168.100.250
  register: gw
"""

RETURN = r"""
haproxy:
  description: HAProxy's master process, running or not, and its pid.
  returned: always
  type: dict
  sample: {running: true, pid: 4242}
keepalived:
  description: keepalived, running or not, and its pid.
  returned: always
  type: dict
  sample: {running: true, pid: 4243}
vip_held:
  description: Whether this host has O(vip) on one of its interfaces.
  returned: always
  type: bool
servers:
  description: Every backend server (none when HAProxy does not answer; see RV(error)).
  returned: always
  type: list
  elements: dict
  sample: [{backend: be_service, server: a-1, status: DRAIN, state: drain, sessions: 0}]
error:
  description: Why the servers could not be read (HAProxy down, admin socket missing); empty when they were.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import daemon, haproxy_admin, host, proc


def main():
    module = AnsibleModule(
        argument_spec=dict(vip=dict(type="str"), socket=dict(type="path", default=haproxy_admin.ADMIN_SOCKET),
                           haproxy_pid_file=dict(type="path", default="/run/haproxy.pid"),
                           keepalived_pid_file=dict(type="path", default="/run/keepalived.pid"),
                           timeout=dict(type="float", default=5.0)),
        supports_check_mode=True)
    p = module.params
    haproxy = daemon.pid_file_running(p["haproxy_pid_file"])
    keepalived = daemon.pid_file_running(p["keepalived_pid_file"])
    held = False
    if p["vip"]:
        try:
            nics = host.ipv4_addresses(lambda argv: proc.run(argv, p["timeout"])[:2])
        except ValueError:
            nics = None
        held = any(p["vip"] in addrs for addrs in (nics or {}).values())
    servers, error = [], ""
    try:
        servers = haproxy_admin.servers(p["socket"], p["timeout"])
    except haproxy_admin.AdminError as e:
        error = str(e)
    module.exit_json(changed=False, haproxy={"running": bool(haproxy), "pid": haproxy},
                     keepalived={"running": bool(keepalived), "pid": keepalived}, vip_held=held, servers=servers,
                     error=error)


if __name__ == "__main__":
    main()
