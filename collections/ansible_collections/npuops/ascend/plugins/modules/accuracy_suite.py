#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: accuracy_suite
short_description: Run a standard accuracy suite (lm-eval) against a served model and account its samples
version_added: 0.3.0
description:
  - Runs the Language Model Evaluation Harness (C(lm_eval run), its C(local-chat-completions) model, or
    C(local-completions) with O(chat=false)) against the endpoint for O(tasks) defined in O(include_path), every
    sample logged, and reads back what it wrote - the score of each task's first metric, in points, and the samples
    accounted as the vLLM-Ascend Kimi-K3 tutorial asks (completed, failed, missing, unparsed).
  - Nothing is downloaded at run time - the task files' datasets must be local files (checked first; a missing one
    fails naming its path) and the Hugging Face libraries run offline.
  - The API key reaches lm-eval in its environment (C(OPENAI_API_KEY)), never on its command line.
  - Judging the scores against baselines is the role's (filter P(npuops.ascend.accuracy_verdict#filter)).
author:
  - npuops maintainers (@npuops)
extends_documentation_fragment:
  - npuops.ascend.endpoint
options:
  model:
    description: The served model name to ask.
    type: str
    required: true
  tasks:
    description: The lm-eval tasks to run (defined in O(include_path)).
    type: list
    elements: str
    required: true
  include_path:
    description: The directory of the tasks' YAML files (lm-eval's C(--include_path)).
    type: path
    required: true
  lm_eval:
    description: The lm-eval executable (C(lm_eval) on the PATH, or a path into its virtualenv).
    type: str
    default: lm_eval
  output_dir:
    description: Where lm-eval writes its results and samples (a fresh directory per run is made under it).
    type: path
    required: true
  limit:
    description: At most this many samples per task (all when unset).
    type: int
  concurrency:
    description: Requests lm-eval sends at once.
    type: int
    default: 4
  chat:
    description: Use the chat completions endpoint (with the chat template) rather than plain completions.
    type: bool
    default: true
  timeout:
    description: Seconds the whole run may take; lm-eval is killed after it.
    type: int
    default: 1800
attributes:
  check_mode:
    description: Runs in check mode; it only sends requests and writes lm-eval's output under O(output_dir).
    support: full
  diff_mode:
    description: Nothing changes on the node but lm-eval's output directory.
    support: none
seealso:
  - module: npuops.ascend.accuracy_probe
"""

EXAMPLES = r"""
- name: GPQA from a local copy with lm-eval
  npuops.ascend.accuracy_suite:
    url: http://10.0.0.11:8000
    model: kimi-k3
    tasks: [gpqa_local]
    include_path: /srv/eval/tasks
    output_dir: /srv/eval/out
    lm_eval: /opt/lm-eval/bin/lm_eval
  delegate_to: loadgen-01
"""

RETURN = r"""
tasks:
  description: Per task, its metric, its score in points and the sample accounting.
  returned: success
  type: dict
  sample:
    gpqa_local: {metric: "exact_match,strict-match", score: 71.2, samples: {total: 198, completed: 198, failed: 0,
                 missing: 0, unparsed: 3, correct: 141, wrong: 54}}
results_file:
  description: The results file lm-eval wrote.
  returned: success
  type: str
seconds:
  description: How long lm-eval ran.
  returned: always
  type: float
"""

import glob
import json
import os
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import accuracy, proc

try:
    import yaml
    HAS_YAML = True
except ImportError:
    HAS_YAML = False


def task_documents(include_path):
    docs = []
    for path in sorted(glob.glob(os.path.join(include_path, "*.yaml")) + glob.glob(os.path.join(include_path, "*.yml"))):
        with open(path) as f:
            doc = yaml.safe_load(f)
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model=dict(type="str", required=True),
            tasks=dict(type="list", elements="str", required=True),
            include_path=dict(type="path", required=True),
            lm_eval=dict(type="str", default="lm_eval"),
            output_dir=dict(type="path", required=True),
            limit=dict(type="int"),
            concurrency=dict(type="int", default=4),
            chat=dict(type="bool", default=True),
            timeout=dict(type="int", default=1800),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not HAS_YAML:
        module.fail_json(msg="accuracy_suite needs PyYAML on %s (it reads the task files)" % os.uname()[1])
    if not os.path.isdir(p["include_path"]):
        module.fail_json(msg="the tasks' directory %s does not exist on this host; put the task files (and their local "
                             "datasets) there, or set the suite's include_path" % p["include_path"])
    missing = [f for f in accuracy.task_data_files(task_documents(p["include_path"])) if not os.path.exists(f)]
    if missing:
        module.fail_json(msg="the dataset %s is not on this host (nothing is downloaded at run time); copy it there or "
                             "correct the task file in %s" % (", ".join(sorted(set(missing))), p["include_path"]))
    if not os.path.isdir(p["output_dir"]):
        os.makedirs(p["output_dir"])
    out = tempfile.mkdtemp(prefix="lm-eval-", dir=p["output_dir"])
    argv = accuracy.lm_eval_argv(p["lm_eval"], p["url"], p["model"], p["tasks"], p["include_path"], out,
                                 p["limit"], p["concurrency"], p["chat"])
    env = dict(accuracy.OFFLINE_ENV, OPENAI_API_KEY=p["api_key"] or "EMPTY")
    t0 = time.time()
    rc, stdout, stderr = proc.run(argv, p["timeout"], env=env)
    seconds = round(time.time() - t0, 2)
    found = sorted(glob.glob(os.path.join(out, "*", "results_*.json")) + glob.glob(os.path.join(out, "results_*.json")))
    if rc != 0 or not found:
        tail = (stderr or stdout).strip().splitlines()[-8:]
        module.fail_json(msg="lm-eval failed (rc %s) against %s for %s: %s" % (
            rc, p["url"], ", ".join(p["tasks"]), " | ".join(tail) or "no output"), seconds=seconds, argv=argv)
    with open(found[-1]) as f:
        results = json.load(f)
    samples = {}
    for task in results.get("results") or {}:
        rows = []
        for path in glob.glob(os.path.join(os.path.dirname(found[-1]), "samples_%s_*.jsonl" % task)):
            with open(path) as f:
                rows.extend(json.loads(line) for line in f if line.strip())
        samples[task] = rows
    module.exit_json(changed=False, tasks=accuracy.lm_eval_account(results, samples), results_file=found[-1],
                     seconds=seconds)


if __name__ == "__main__":
    main()
