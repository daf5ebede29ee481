#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: weight_wait
short_description: Follow the weight copies of a run until they all end, or one fails
version_added: 0.2.0
description:
  - An action plugin; it runs on the controller, one per host taking part in the copy, all at once.
  - On a receiving host (O(job) given) it looks at the node every O(interval) seconds (the async status of the
    M(npuops.ascend.weight_sync) job, and its progress file) and prints one line of progress for that node
    (files, GB, MB/s of the last seconds and ETA). A progress file of another run is not shown. It ends when
    the job ends and returns the job's result.
  - On a host that only serves (no O(job)) it checks every O(interval) seconds that the node is still
    reachable, until every receiver ended.
  - "All or nothing: the hosts of one run share their state through a directory on the controller. When one
    host's copy fails or the host becomes unreachable, every other host ends its own copy job and servers of
    the run (M(npuops.ascend.weight_stop)) within about a second and fails, naming that host (RV(stopped_because))."
  - One task, bounded by O(timeout); no include or recursion per look, so a copy of any length is followed.
author:
  - npuops maintainers (@npuops)
options:
  job:
    description: The async job id of this host's M(npuops.ascend.weight_sync); omit on hosts that only serve.
    type: str
  dest:
    description: The model directory on the node (its progress is C(<dest>/.npuops/sync-progress.json)).
    type: path
    required: true
  run_id:
    description: The run's id (names the shared state, filters the progress of this run).
    type: str
    required: true
  hosts:
    description: Every host taking part in the copy (receivers and servers).
    type: list
    elements: str
    required: true
  receivers:
    description: The hosts that receive; a host that only serves waits until these ended.
    type: list
    elements: str
    required: true
  interval:
    description: Seconds between looks at the node (and progress lines); at most 30.
    type: int
    default: 20
  timeout:
    description: The longest the copy may take, in seconds; then this host's job is ended and the task fails.
    type: int
    default: 14400
  lost_after:
    description: Seconds without news from another host's watcher after which that host counts as lost.
    type: int
    default: 90
attributes:
  check_mode:
    description: Nothing to follow in check mode (the copy does not run).
    support: none
  diff_mode:
    description: No diff.
    support: none
  action:
    description: Runs on the controller.
    support: full
seealso:
  - module: npuops.ascend.weight_sync
  - module: npuops.ascend.weight_stop
"""

EXAMPLES = r"""
- name: Follow the copies until they end
  npuops.ascend.weight_wait:
    job: "{{ copy_job.ansible_job_id | default(omit) }}"
    dest: /data/models/Kimi-K3-W4A8
    run_id: "{{ run_id }}"
    hosts: "{{ servers | union(receivers) }}"
    receivers: "{{ receivers }}"
  register: copy_status
"""

RETURN = r"""
state:
  description: C(done), C(failed), C(unreachable) or C(stopped) (ended because another host failed).
  returned: always
  type: str
stopped_because:
  description: The hosts whose failure ended this one.
  returned: when RV(state) is C(stopped)
  type: list
  elements: str
progress:
  description: The last progress line of this node.
  returned: always
  type: str
files_fetched:
  description: The job's result (all of M(npuops.ascend.weight_sync)'s return values) on a receiver whose copy ended.
  returned: when the job ended
  type: int
"""
