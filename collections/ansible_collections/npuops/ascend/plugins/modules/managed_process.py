#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: managed_process
short_description: A long-running process owned through its pid file, on hosts without systemd
version_added: 0.2.0
description:
  - Keeps one process running with exactly the command line O(argv), recorded in O(pid_file) with its start time
    (a recycled pid is never taken for it). The same command line running -> nothing changes; another one -> the
    old process (its session) is ended and the new one started, its output appended to O(log_file).
  - With O(reload_token) (for example the checksum of its configuration file), a changed token with an unchanged
    command line sends SIGHUP to exactly that process instead of restarting it (Prometheus reloads its
    configuration and rules on SIGHUP).
  - With O(ready_url), waits until it answers 2xx after a start, restart or reload, and fails with the log's tail.
  - The monitoring role uses it for Prometheus on hosts without systemd (and on the simulated nodes).
author:
  - npuops maintainers (@npuops)
options:
  argv:
    description: The command line. Required with O(state=started).
    type: list
    elements: str
  state:
    description: Whether it runs.
    type: str
    choices: [started, stopped]
    default: started
  pid_file:
    description: Where the process is recorded.
    type: path
    required: true
  log_file:
    description: Its output.
    type: path
  reload_token:
    description: A value that changes when the process must reload (SIGHUP).
    type: str
  ready_url:
    description: A URL that answers 2xx once the process is ready.
    type: str
  ready_timeout:
    description: Seconds to wait for O(ready_url).
    type: int
    default: 60
attributes:
  check_mode:
    description: Reports whether it would start, restart, reload or stop.
    support: full
  diff_mode:
    description: No diff.
    support: none
seealso:
  - module: npuops.ascend.npu_exporter
"""

EXAMPLES = r"""
- name: Prometheus, reloaded when its configuration changes
  npuops.ascend.managed_process:
    argv: [/usr/bin/prometheus, --config.file=/etc/npuops/prometheus/prometheus.yml,
           --web.listen-address=10.0.0.11:9090]
    pid_file: /run/npuops/prometheus.pid
    log_file: /var/log/npuops/prometheus.log
    reload_token: "{{ config_checksum }}"
    ready_url: http://10.0.0.11:9090/-/ready
"""

RETURN = r"""
action:
  description: What was done (none, started, restarted, reloaded, stopped).
  returned: always
  type: str
  sample: reloaded
pid:
  description: The process's pid.
  returned: when it runs
  type: int
  sample: 4242
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import daemon


def main():
    module = AnsibleModule(
        argument_spec=dict(
            argv=dict(type="list", elements="str"),
            state=dict(type="str", choices=["started", "stopped"], default="started"),
            pid_file=dict(type="path", required=True),
            log_file=dict(type="path"),
            reload_token=dict(type="str", no_log=False),
            ready_url=dict(type="str"),
            ready_timeout=dict(type="int", default=60),
        ),
        required_if=[("state", "started", ("argv", "log_file"))],
        supports_check_mode=True,
    )
    p = module.params
    result = daemon.converge(p["argv"] or [], p["pid_file"], p["log_file"] or "/dev/null", state=p["state"],
                             reload_token=p["reload_token"], check_mode=module.check_mode)
    out = {"changed": result["changed"], "action": result["action"]}
    if result["record"]:
        out["pid"] = result["record"]["pid"]
    if p["ready_url"] and p["state"] == "started" and result["changed"] and not module.check_mode:
        ok, why = daemon.wait_http(p["ready_url"], p["ready_timeout"])
        if not ok:
            module.fail_json(msg="%s did not answer at %s within %ss after it was %s (%s); its log: %s"
                             % (p["argv"][0], p["ready_url"], p["ready_timeout"], result["action"], why,
                                daemon.log_tail(p["log_file"])), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
