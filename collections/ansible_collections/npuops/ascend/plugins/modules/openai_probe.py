#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: openai_probe
short_description: Check an OpenAI-compatible endpoint the way its users use it
version_added: 0.1.0
description:
  - Runs smoke checks against a vLLM endpoint or the PD proxy in front of it, and returns one row per check
    (name, ok, detail, latency).
  - V(health) (the health path answers 200), V(models) (the model is served), V(token) (a one-token completion
    gives a token, the request status and the gateway agent send; run only when asked), V(chat) (a chat completion
    gives the right answer - 17*23 is 391 - which a deployment that answers garbage fails), V(reasoning) (the
    reasoning comes back apart from the answer), V(tool_call) (C(get_weather) with C(tool_choice=auto) gives
    C(finish_reason=tool_calls) and parseable arguments), V(image) (an image plus text), V(long_prompt) (a long
    prompt of O(long_prompt_tokens)), V(stream) (streaming, with the time to first token measured).
  - Fails with the failed rows unless O(fail_on_error=false).
author:
  - npuops maintainers (@npuops)
extends_documentation_fragment:
  - npuops.ascend.endpoint
options:
  model:
    description: The served model name. By default the first model C(/v1/models) lists.
    type: str
  health_path:
    description: The health URL path (C(/health) for vLLM, C(/healthcheck) for the PD proxy).
    type: str
    default: /health
  checks:
    description: Which checks to run.
    type: list
    elements: str
    choices: [health, models, token, chat, reasoning, tool_call, image, long_prompt, stream]
    default: [health, models, chat, reasoning, tool_call, image, long_prompt, stream]
  models_url:
    description:
      - Base URL to ask for C(/v1/models) when O(url) has none (HTTP 404), for example a serving engine
        behind a vllm-ascend v0.23.0 PD proxy, which serves no C(/v1/models).
      - The check says where the list came from.
    type: str
  long_prompt_tokens:
    description: Length of the long prompt, in (approximate) tokens.
    type: int
    default: 8000
  timeout:
    description: Seconds each request may take.
    type: int
    default: 60
  budget:
    description:
      - Seconds all the checks together may take (V(0) for no bound but each request's O(timeout)). Each request
        gets at most what is left; checks that find nothing left fail as not run. A frozen engine then costs one
        budget, not one timeout per check.
    type: int
    default: 0
  fail_on_error:
    description: Fail the task when a check failed.
    type: bool
    default: true
attributes:
  check_mode:
    description: Runs in check mode; it only sends requests.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
seealso:
  - module: npuops.ascend.vllm_bench
"""

EXAMPLES = r"""
- name: Smoke-check the service through the PD proxy
  npuops.ascend.openai_probe:
    url: http://10.0.0.11:8080
    health_path: /healthcheck
    models_url: http://10.0.0.11:8000
    api_key: "{{ vault_api_key }}"
  delegate_to: localhost
"""

RETURN = r"""
ok:
  description: V(true) when every check passed.
  returned: always
  type: bool
model:
  description: The model the checks used.
  returned: always
  type: str
checks:
  description: One row per check.
  returned: always
  type: list
  elements: dict
  sample:
    - {name: chat, ok: true, detail: "answer: ... 17*23=391", latency_s: 0.41}
    - {name: stream, ok: true, detail: "TTFT 0.052s, 44 chunks, 44 completion tokens in the usage chunk, finish stop",
       latency_s: 0.49}
failed_checks:
  description: The rows that failed.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import probe
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import Client


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model=dict(type="str"),
            health_path=dict(type="str", default="/health"),
            models_url=dict(type="str"),
            checks=dict(type="list", elements="str", choices=list(probe.CHOICES), default=list(probe.ALL)),
            long_prompt_tokens=dict(type="int", default=8000, no_log=False),
            timeout=dict(type="int", default=60),
            budget=dict(type="int", default=0),
            fail_on_error=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    client = Client(p["url"], p["api_key"], timeout=p["timeout"])
    models_client = Client(p["models_url"], p["api_key"], timeout=p["timeout"]) if p["models_url"] else None
    rows, model = probe.run_checks(client, p["model"], p["checks"], p["health_path"], p["long_prompt_tokens"],
                                   models_client=models_client, budget=p["budget"] or None)
    failed = [r for r in rows if not r["ok"]]
    result = dict(changed=False, ok=not failed, model=model, checks=rows, failed_checks=failed)
    if failed and p["fail_on_error"]:
        module.fail_json(msg="%d check(s) failed at %s: %s" % (len(failed), p["url"], "; ".join(
            "%s: %s" % (r["name"], r["detail"]) for r in failed)), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
