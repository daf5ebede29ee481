#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_bench
short_description: Run a benchmark load matrix against a vLLM endpoint
version_added: 0.1.0
description:
  - Runs each point of a load matrix, one after the other, and returns the result of every point in the
    format C(vllm bench serve --save-result --save-detailed) writes (throughputs, TTFT/TPOT/ITL/E2EL
    statistics and the per-request lists).
  - V(random) points run C(vllm bench serve) inside the engine container O(container) on this host, so the
    load is generated next to the server, as the published reference runs were.
  - V(multi_turn) points replay agentic sessions from this host; every turn resends the whole growing
    conversation, so the prefix cache is exercised. C(vllm bench serve) has no such dataset, so the module
    streams the turns itself and records the same fields, plus the sessions.
  - Every result also carries C(npuops.planned) (the requests and sessions the point meant to send) and
    C(npuops.prefix_cache_hit_rate), from the prefix-cache counters of O(metrics_from) read before and after
    the point.
  - The API key reaches C(vllm bench serve) on the standard input of C(<engine> exec -i), which exports it as
    C(OPENAI_API_KEY) inside the container, so it is on no command line and in no environment of a process on the
    host (the engine's own key is a mounted secret that C(exec) does not see).
  - A point whose every request is refused with 401 fails naming the API key, not only the counts.
  - C(vllm bench serve) loads its tokenizer before the first request, from C(--tokenizer) or else from
    C(--model), so set O(tokenizer) to the model directory (a served name is no tokenizer).
  - C(vllm bench serve) forces C(ignore_eos) for the random dataset, so a V(random) point with
    C(ignore_eos=false) is refused rather than reported as something it did not run.
author:
  - npuops maintainers (@npuops)
extends_documentation_fragment:
  - npuops.ascend.container_engine
  - npuops.ascend.endpoint
options:
  model:
    description: The served model name.
    type: str
    required: true
  points:
    description:
      - The load points, run in order.
      - Each has C(name), C(kind) (V(random) or V(multi_turn)) and C(concurrency). V(random) points have
        C(input_len), C(output_len), C(num_prompts) and C(ignore_eos); V(multi_turn) points have C(turns),
        C(output_len) per turn, C(context_tokens) (the private context each session starts with) and
        C(sessions) (default C(concurrency)).
    type: list
    elements: dict
    required: true
  tokenizer:
    description:
      - Where V(random) points load the tokenizer from, inside the engine container (the model directory).
      - Without it C(vllm bench serve) takes O(model) as a tokenizer name, which fails for a served name.
    type: str
  tokenizer_mode:
    description: The tokenizer mode C(vllm bench serve) loads it with (the served model's, for example V(kimi_k3)).
    type: str
    default: auto
  trust_remote_code:
    description: Let the tokenizer run its own code (Kimi's tokenizer is custom code).
    type: bool
    default: false
  container:
    description: The engine container V(random) points run C(vllm bench serve) in.
    type: str
  result_dir:
    description: Directory inside the container where C(vllm bench serve) saves its results.
    type: str
    default: /tmp/npuops-bench
  metrics_from:
    description:
      - Base URLs of every engine that serves (their C(/metrics) hold the prefix-cache counters).
      - By default O(url).
    type: list
    elements: str
  timeout:
    description: Seconds a single request may take.
    type: int
    default: 3600
attributes:
  check_mode:
    description: In check mode nothing is sent; the planned requests of every point are returned.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
seealso:
  - module: npuops.ascend.bench_report
  - module: npuops.ascend.openai_probe
"""

EXAMPLES = r"""
- name: Reference random points from the leader container
  npuops.ascend.vllm_bench:
    url: http://10.0.0.11:8000
    model: kimi-k3
    engine: docker
    container: npuops-vllm
    tokenizer: /data/models/Kimi-K3-W4A8
    tokenizer_mode: kimi_k3
    trust_remote_code: true
    points:
      - {name: random-c8, kind: random, concurrency: 8, input_len: 2048, output_len: 512, num_prompts: 64,
         ignore_eos: true}
      - {name: agentic-80k-c2, kind: multi_turn, concurrency: 2, turns: 13, output_len: 220,
         context_tokens: 80000}
  register: bench
"""

RETURN = r"""
results:
  description:
    - One result per point, as C(vllm bench serve) saves it, plus C(npuops) (the point, C(planned) requests and
      sessions, C(prefix_cache_hit_rate)).
  returned: success
  type: list
  elements: dict
  sample:
    - {num_prompts: 64, max_concurrency: 8, completed: 64, failed: 0, output_throughput: 1843.2,
       p99_ttft_ms: 812.4, npuops: {planned: {requests: 64, sessions: null}, prefix_cache_hit_rate: 0.02,
                                    external_prefix_cache_hit_rate: null}}
planned:
  description: The requests and sessions each point plans to send, by point name.
  returned: always
  type: dict
  sample: {random-c8: {requests: 64, sessions: null}}
"""

import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import bench
from ansible_collections.npuops.ascend.plugins.module_utils.container import ENGINE_OPTION
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import ApiError, Client

POINT_KEYS = {"random": ("input_len", "output_len", "num_prompts"),
              "multi_turn": ("turns", "output_len", "context_tokens")}


def point_errors(points):
    errors = []
    seen = set()
    for i, point in enumerate(points):
        name = point.get("name")
        where = "points[%d] (%s)" % (i, name or "no name")
        if not name or not re.match(r"^[A-Za-z0-9_.-]+$", str(name)):
            errors.append("%s: name must be letters, digits, '.', '_' or '-'" % where)
        elif name in seen:
            errors.append("%s: the name is used twice" % where)
        seen.add(name)
        kind = point.get("kind")
        if kind not in POINT_KEYS:
            errors.append("%s: kind must be random or multi_turn, not %r" % (where, kind))
            continue
        for key in ("concurrency",) + POINT_KEYS[kind]:
            value = point.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                errors.append("%s: %s must be a positive integer, not %r" % (where, key, value))
        if kind == "random" and point.get("ignore_eos") is False:
            errors.append("%s: ignore_eos is false, but vllm bench serve forces ignore_eos for the random dataset "
                          "(vllm/benchmarks/serve.py): drop it, or use a multi_turn point" % where)
    return errors


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model=dict(type="str", required=True),
            points=dict(type="list", elements="dict", required=True),
            engine=ENGINE_OPTION,
            container=dict(type="str"),
            tokenizer=dict(type="str", no_log=False),
            tokenizer_mode=dict(type="str", default="auto", no_log=False),
            trust_remote_code=dict(type="bool", default=False),
            result_dir=dict(type="str", default="/tmp/npuops-bench"),
            metrics_from=dict(type="list", elements="str"),
            timeout=dict(type="int", default=3600),
        ),
        supports_check_mode=True,
    )
    p = module.params
    errors = point_errors(p["points"])
    if any(pt.get("kind") == "random" for pt in p["points"]) and not p["container"]:
        errors.append("random points run vllm bench serve in the engine container: set container")
    if errors:
        module.fail_json(msg="the load matrix is not valid: " + "; ".join(errors))
    planned = dict((pt["name"], bench.planned(pt)) for pt in p["points"])
    if module.check_mode:
        module.exit_json(changed=False, planned=planned, results=[])

    cli = module.get_bin_path(p["engine"], required=True) if p["container"] else None

    def run_in_container(argv):
        args, kwargs = bench.exec_argv(cli, p["container"], argv, p["api_key"])
        return module.run_command(args, **kwargs)
    exec_in_container = run_in_container if cli else None

    tokenizer = {"path": p["tokenizer"], "mode": p["tokenizer_mode"], "trust_remote_code": p["trust_remote_code"]}
    client = Client(p["url"], p["api_key"], timeout=p["timeout"])
    metrics_clients = [Client(u, p["api_key"], timeout=30) for u in (p["metrics_from"] or [p["url"]])]
    try:
        bench.check_access(client, p["model"])
    except ApiError as e:
        module.fail_json(msg="the benchmark cannot use %s: %s" % (p["url"], e), results=[], planned=planned)
    results = []
    for point in p["points"]:
        try:
            results.append(bench.run_point(point, client, p["model"], exec_in_container, p["result_dir"],
                                           metrics_clients, tokenizer))
        except (ApiError, ValueError) as e:
            module.fail_json(msg="benchmark point %s failed: %s" % (point["name"], e), results=results,
                             planned=planned)
    module.exit_json(changed=False, results=results, planned=planned)


if __name__ == "__main__":
    main()
