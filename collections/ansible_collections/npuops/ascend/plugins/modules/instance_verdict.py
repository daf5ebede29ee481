#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: instance_verdict
short_description: Read or record the gates' verdicts on an instance's configurations
version_added: 0.3.0
description:
  - The record of one instance, kept on its first host (a root-only JSON file under O(directory)) - per
    configuration (the id of what its engines run, from their containers' specs), the verdict of each gate that
    judged it - C(answers) (the accuracy gate) and C(speed) (the rollout's speed gate) - and the engines of the last
    configuration that passed, which a failing configuration is restored to.
  - O(action=read) returns the record. O(action=record) adds the verdict of O(gate) on O(config) (and, for a pass,
    O(engines) as the last good configuration). A verdict lasts until the same configuration is measured again.
  - Status reports an instance whose running configuration failed as C(wrong); every path that puts an instance into
    rotation (a rolling update, its rerun after an interruption, C(recover.yml), C(gateway.yml), the accuracy stage)
    asks this record first, and measures a configuration no gate judged.
author:
  - npuops maintainers (@npuops)
options:
  instance:
    description: The instance (its name in the plan).
    type: str
    required: true
  action:
    description: Read the record, or record a verdict.
    type: str
    choices: [read, record]
    default: read
  config:
    description: The configuration judged (its id). Required with O(action=record).
    type: str
  gate:
    description: The gate that judged it.
    type: str
    choices: [answers, speed]
    default: answers
  verdict:
    description: The gate's verdict. Required with O(action=record).
    type: str
    choices: [passed, failed]
  detail:
    description: Why, in one line (scores against their baselines).
    type: str
    default: ""
  at:
    description:
      - When it was measured (ISO 8601, UTC). The same verdict with the same detail already recorded for the
        configuration keeps its first time (the record says since when it holds) and the task reports no change.
    type: str
    default: ""
  engines:
    description:
      - "With a pass, what the configuration's engines ran - C({host: {container name: {exists, spec}}}) - kept as
        the last good configuration (specs carry secrets as keyed digests only)."
    type: dict
  directory:
    description: Where the records are kept.
    type: path
    default: /var/lib/npuops/verdicts
attributes:
  check_mode:
    description: Reports the record that would be written; writes nothing.
    support: full
  diff_mode:
    description: No diff; RV(record) is the record after the action.
    support: none
"""

EXAMPLES = r"""
- name: Read instance a's verdicts
  npuops.ascend.instance_verdict:
    instance: a
  register: verdicts

- name: Record that its running configuration passed the accuracy gate
  npuops.ascend.instance_verdict:
    instance: a
    action: record
    config: cfg-0f3a9c2e1b7d4a6e5c8f
    gate: answers
    verdict: passed
    detail: "golden 100.00 (baseline 100.00 +- 5.00)"
    at: "2026-12-06T10:00:00Z"
"""

RETURN = r"""
record:
  description: The instance's record (after the action).
  returned: always
  type: dict
  sample:
    instance: a
    configs: {cfg-0f3a9c2e1b7d4a6e5c8f: {answers: {verdict: passed, at: "2026-12-06T10:00:00Z",
                                                   detail: "golden 100.00 (baseline 100.00 +- 5.00)"}}}
    order: [cfg-0f3a9c2e1b7d4a6e5c8f]
    last_good: {config: cfg-0f3a9c2e1b7d4a6e5c8f, engines: {}, at: "2026-12-06T10:00:00Z"}
path:
  description: The record's file.
  returned: always
  type: str
  sample: /var/lib/npuops/verdicts/a.json
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import verdict


def main():
    module = AnsibleModule(
        argument_spec=dict(
            instance=dict(type="str", required=True),
            action=dict(type="str", choices=["read", "record"], default="read"),
            config=dict(type="str"),
            gate=dict(type="str", choices=list(verdict.GATES), default="answers"),
            verdict=dict(type="str", choices=[verdict.PASSED, verdict.FAILED]),
            detail=dict(type="str", default=""),
            at=dict(type="str", default=""),
            engines=dict(type="dict"),
            directory=dict(type="path", default=verdict.DIRECTORY),
        ),
        required_if=[("action", "record", ("config", "verdict"))],
        supports_check_mode=True,
    )
    p = module.params
    host = module.params.get("instance")
    try:
        path = verdict.path_of(p["directory"], p["instance"])
        doc = verdict.load(path, p["instance"])
        if p["action"] == "read":
            module.exit_json(changed=False, record=doc, path=path)
        new = verdict.record(doc, p["instance"], p["config"], p["gate"], p["verdict"], p["detail"], p["at"],
                             p["engines"])
        changed = new != doc
        if changed and not module.check_mode:
            verdict.save(path, new)
    except (verdict.VerdictError, IOError, OSError) as e:
        module.fail_json(msg="instance %s: %s" % (host, e))
    module.exit_json(changed=changed, record=new, path=path)


if __name__ == "__main__":
    main()
