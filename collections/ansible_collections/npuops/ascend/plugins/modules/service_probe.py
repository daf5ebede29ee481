#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: service_probe
short_description: Prove that every instance of the service produces a token, in bounded time
version_added: 0.1.0
description:
  - For every instance, a one-token completion through its front door (the leader's API, or the PD proxy) and
    its health path; for every serving engine, its C(/health). C(/health) alone proves little - an engine whose
    collective hangs on the NPUs still answers it while no token comes out - so the token decides.
  - All probes run at once, each bounded by its own timeout, so the whole probe takes about
    O(token_timeout) whatever is broken.
author:
  - npuops maintainers (@npuops)
options:
  instances:
    description:
      - The instances, each C({name, url, model, health_path, engines, metrics}) (C(engines) the serving engines' base
        URLs whose /health is asked; C(metrics) the engines whose /metrics are read twice, beside the token probe, to
        tell a busy instance - requests in flight, engine steps - from one that makes no progress).
    type: list
    elements: dict
    required: true
  api_key:
    description: The service's API key, if it has one (sent as a bearer token, never logged).
    type: str
  token_timeout:
    description: Seconds the one-token completion may take.
    type: float
    default: 10
  health_timeout:
    description: Seconds each health request may take.
    type: float
    default: 3
attributes:
  check_mode:
    description: Runs in check mode; it only sends requests.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
seealso:
  - module: npuops.ascend.openai_probe
"""

EXAMPLES = r"""
- name: Does every instance answer?
  npuops.ascend.service_probe:
    instances:
      - {name: main, url: "http://10.0.0.11:8000", model: kimi-k3, health_path: /health,
         engines: ["http://10.0.0.11:8000"]}
  delegate_to: localhost
"""

RETURN = r"""
probes:
  description: Per instance, the front door's token and health, each engine's health, and the engines' progress.
  returned: always
  type: dict
  sample:
    main:
      front: {ok: false, seconds: 10.0, detail: no token within 10s, timed_out: true}
      front_health: {ok: true, status: 200, seconds: 0.01, detail: /health -> 200}
      engines: {"http://10.0.0.11:8000": {ok: true, status: 200, seconds: 0.01, detail: /health -> 200}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import status


def main():
    module = AnsibleModule(
        argument_spec=dict(
            instances=dict(type="list", elements="dict", required=True),
            api_key=dict(type="str", no_log=True),
            token_timeout=dict(type="float", default=10),
            health_timeout=dict(type="float", default=3),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for inst in p["instances"]:
        missing = [k for k in ("name", "url", "model") if not inst.get(k)]
        if missing:
            module.fail_json(msg="instances entry %r lacks %s" % (inst, ", ".join(missing)))
    module.exit_json(changed=False, probes=status.probe_all(p["instances"], p["api_key"], p["token_timeout"],
                                                            p["health_timeout"]))


if __name__ == "__main__":
    main()
