#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: accuracy_probe
short_description: Measure the answers of a served model on a golden set, and check its API the way verifiers do
version_added: 0.3.0
description:
  - Asks every item of O(items) as a greedy chat completion (temperature 0) and scores the final answer (the
    content after a reasoning model's reasoning; C(\\boxed{}), "answer is", the last number) by exact match.
  - Accounts the samples as the vLLM-Ascend Kimi-K3 tutorial asks (section 7) - completed, failed, missing (not
    sent within O(budget)) and unparsed - and scores over every planned item, so a failed sample counts as wrong.
  - With V(api) in O(checks), checks that sampling parameters are honoured (C(max_tokens), C(n), C(stop)), that a
    tool call's arguments are valid for the tool's JSON schema, and that C(usage.prompt_tokens) is plausible.
  - Judging the score against a baseline is the role's (filter P(npuops.ascend.accuracy_verdict#filter)).
author:
  - npuops maintainers (@npuops)
extends_documentation_fragment:
  - npuops.ascend.endpoint
options:
  model:
    description: The served model name to ask.
    type: str
    required: true
  items:
    description: The golden set's items, each C({id, question, answer}).
    type: list
    elements: dict
    default: []
  checks:
    description: What to run.
    type: list
    elements: str
    choices: [golden, api]
    default: [golden, api]
  concurrency:
    description: Items asked at once.
    type: int
    default: 4
  max_tokens:
    description: The completion budget of each item (a reasoning model reasons first).
    type: int
    default: 1024
  timeout:
    description: Seconds each request may take.
    type: int
    default: 120
  budget:
    description: Seconds the whole golden set may take; items not sent by then are missing.
    type: int
    default: 900
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
- name: Score an instance on the golden set
  npuops.ascend.accuracy_probe:
    url: http://10.0.0.11:8000
    model: kimi-k3
    items: "{{ (lookup('ansible.builtin.file', 'golden.yml') | from_yaml).items }}"
  delegate_to: localhost
"""

RETURN = r"""
samples:
  description: The accounting of the golden set and its score in points (0-100); V(null) when it was not asked.
  returned: always
  type: dict
  sample: {total: 64, completed: 64, failed: 0, missing: 0, unparsed: 0, correct: 64, wrong: 0, score: 100.0}
wrong:
  description: Up to 5 items answered wrongly, unparsed or failed, each with the expected and the extracted answer.
  returned: always
  type: list
  elements: dict
api:
  description: One row per API check (name, ok, detail).
  returned: always
  type: list
  elements: dict
seconds:
  description: How long the golden set took.
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import accuracy
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import Client


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model=dict(type="str", required=True),
            items=dict(type="list", elements="dict", default=[]),
            checks=dict(type="list", elements="str", choices=["golden", "api"], default=["golden", "api"]),
            concurrency=dict(type="int", default=4),
            max_tokens=dict(type="int", default=1024, no_log=False),
            timeout=dict(type="int", default=120),
            budget=dict(type="int", default=900),
        ),
        supports_check_mode=True,
    )
    p = module.params
    client = Client(p["url"], p["api_key"], timeout=p["timeout"])
    items = [dict(i, id=str(i.get("id")), answer=str(i.get("answer"))) for i in p["items"]]
    t0 = time.time()
    results = {}
    if "golden" in p["checks"] and items:
        results = accuracy.ask_golden(client, p["model"], items, budget=p["budget"], concurrency=p["concurrency"],
                                      max_tokens=p["max_tokens"])
    seconds = round(time.time() - t0, 2)
    samples = accuracy.account(items, results)
    wrong = []
    for item in items:
        r = results.get(item["id"])
        if r is None or r["status"] != "ok" or r.get("answer") != accuracy.normalize(item["answer"]):
            wrong.append({"id": item["id"], "question": item["question"], "expected": item["answer"],
                          "got": None if r is None else r.get("answer"),
                          "status": "missing" if r is None else r["status"] if r["status"] != "ok" else (
                              "unparsed" if r.get("answer") is None else "wrong"),
                          "content": "" if r is None else (r.get("content") or r.get("detail") or "")[-160:]})
    api = accuracy.api_checks(client, p["model"]) if "api" in p["checks"] else []
    if "golden" not in p["checks"] or not items:
        # nothing was asked: no score to judge (not a score of 0)
        samples, wrong = None, []
    module.exit_json(changed=False, samples=samples, wrong=wrong[:5], api=api, seconds=seconds)


if __name__ == "__main__":
    main()
