#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bench_report
short_description: Write and check the benchmark report on the controller
version_added: 0.1.0
description:
  - An action plugin; it runs on the controller.
  - With O(results) (what M(npuops.ascend.vllm_bench) returned), creates O(report_dir) with C(meta.json), the
    raw result of every point under C(raw/), C(requests.jsonl) (one line per request), C(report.md) (a table
    per series - output, total and per-user tokens/s, TTFT and TPOT P50/P99, prefix-cache hit rate, with a draft its
    acceptance rate and mean acceptance length - and the reconciliation), three PNG plots and C(summary.json).
  - Without O(results), re-reads an existing O(report_dir), reconciles it again and redraws it.
  - The reconciliation checks that planned requests = sent + skipped, sent = succeeded + failed, that the
    per-request lines agree with the results, and that planned sessions = completed + failed sessions. The
    task fails when they do not add up, or when a request failed unless O(allow_failed_requests=true).
author:
  - npuops maintainers (@npuops)
options:
  results:
    description: The results of M(npuops.ascend.vllm_bench). Omit to re-check O(report_dir).
    type: list
    elements: dict
  report_dir:
    description: The report directory; with O(results) it must not hold a report yet.
    type: path
    required: true
  meta:
    description: What the report is about (C(endpoint), C(model), C(tier), C(matrix), C(started)).
    type: dict
    default: {}
  allow_failed_requests:
    description: Do not fail the task when some requests failed (the counts must still add up).
    type: bool
    default: false
  compare_with:
    description:
      - An earlier report directory of the same matrix (a run without the draft, say); the points of both runs are
        put side by side with ratios and the draft's acceptance in C(comparison.md) (the Kimi-K3 tutorial's tuning
        step, a baseline against a DSpark draft on the same workload). A report of another matrix is refused.
    type: path
attributes:
  check_mode:
    description: In check mode no report is written.
    support: full
  diff_mode:
    description: The report is new files, there is no diff.
    support: none
  action:
    description: Runs on the controller.
    support: full
requirements:
  - matplotlib (on the controller)
seealso:
  - module: npuops.ascend.vllm_bench
"""

EXAMPLES = r"""
- name: Write the report
  npuops.ascend.bench_report:
    results: "{{ bench.results }}"
    report_dir: "reports/{{ now(utc=true, fmt='%Y%m%dT%H%M%SZ') }}"
    meta: {endpoint: "http://10.0.0.11:8000", model: kimi-k3, tier: tier_2node_pp, matrix: reference}

- name: Check a saved report again
  npuops.ascend.bench_report:
    report_dir: reports/20261130T120000Z
"""

RETURN = r"""
report:
  description: Path of C(report.md).
  returned: success
  type: str
report_dir:
  description: Absolute path of the report directory.
  returned: success
  type: str
comparison:
  description:
    - With O(compare_with), the points of both runs side by side (C(points) - this run's figures, C(baseline_*) and
      C(ratio_*) of output and per-user tokens/s, TTFT and TPOT, the draft's acceptance), the points only one run
      has, and the path of C(comparison.md).
  returned: when O(compare_with) is set
  type: dict
adds_up:
  description: Whether the reconciliation adds up.
  returned: success
  type: bool
failed_requests:
  description: Requests that failed, over all points.
  returned: success
  type: int
table:
  description: One row per point (series, concurrency, output_tok_s, total_tok_s, per_user_tok_s, ttft/tpot P50/P99,
    prefix_hit_rate).
  returned: success
  type: list
  elements: dict
reconciliation:
  description: One row per point with planned, sent, skipped, succeeded, failed, the sessions and the problems found.
  returned: success
  type: list
  elements: dict
plots:
  description: File names of the PNG plots in O(report_dir).
  returned: success
  type: list
  elements: str
"""
