#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: serve_wait
short_description: Wait for this host's engine container, and stop as soon as any other host's wait failed
version_added: 0.2.0
description:
  - An action plugin; it runs on the controller, one per host of the wait, all at once.
  - It waits for this host's container in slices of O(slice) seconds (M(npuops.ascend.vllm_container) with
    C(state=ready)), until O(url) answers (or, without a URL, until the container stayed up O(timeout) seconds),
    failing when the container exits or a peer in O(peers) stays unreachable for O(unreachable_after) seconds
    (counted across slices).
  - "All or nothing: the hosts of one wait (O(hosts), tied together by O(run_id)) post their state on a board in the
    controller's temp directory after every slice and read the others' before the next. The first container that
    exits, or host that becomes unreachable or goes silent for O(stale_after) seconds, ends every other wait within
    one slice (RV(aborted)), so no leader sits out its timeout for a dead worker."
  - In check mode it waits for nothing.
author:
  - npuops maintainers (@npuops)
extends_documentation_fragment:
  - npuops.ascend.container_engine
options:
  name:
    description: The container.
    type: str
    required: true
  url:
    description: The URL that answers 2xx once the engine (or its group) is ready; without it the container must only stay up.
    type: str
  timeout:
    description: Seconds to wait at most.
    type: int
    default: 600
  interval:
    description: Seconds between two looks within a slice.
    type: float
    default: 2
  peers:
    description: C(host:port) endpoints the container must reach (its leader's rendezvous port).
    type: list
    elements: str
    default: []
  unreachable_after:
    description: Seconds a peer may stay unreachable, across slices.
    type: float
    default: 15
  slice:
    description: Seconds of one look at the node before the board is read again.
    type: int
    default: 10
  run_id:
    description: The id that ties the hosts of one wait together (and keeps them apart from other runs).
    type: str
    required: true
  hosts:
    description: The hosts of the wait.
    type: list
    elements: str
    required: true
  stale_after:
    description: Seconds after which another host that posts nothing counts as lost.
    type: int
    default: 60
attributes:
  check_mode:
    description: Waits for nothing in check mode.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
  action:
    description: Runs on the controller, calling M(npuops.ascend.vllm_container) on the host.
    support: full
seealso:
  - module: npuops.ascend.vllm_container
"""

EXAMPLES = r"""
- name: Wait until the engines of this deploy answer, together
  npuops.ascend.serve_wait:
    name: vllm
    engine: docker
    url: http://10.0.0.11:8000/health
    timeout: 3600
    peers: ["10.0.0.11:13389"]
    run_id: "{{ deploy_run }}-ready"
    hosts: "{{ ansible_play_hosts }}"
"""

RETURN = r"""
ready_after:
  description: Seconds waited.
  returned: when the wait succeeded
  type: float
aborted:
  description: True when this wait ended because another host's failed (the message names it).
  returned: when another host failed
  type: bool
started_at:
  description: When the container started.
  returned: when the wait succeeded
  type: str
"""
