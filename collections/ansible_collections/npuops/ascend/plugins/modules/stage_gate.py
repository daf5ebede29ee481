#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: stage_gate
short_description: The all-or-nothing verdict of one step of a stage, from what each host registered
version_added: 0.2.0
description:
  - An action plugin; it runs on the controller (once, with C(run_once)) and contacts no host.
  - Reads the result every host in O(hosts) registered as O(key) and tells which failed or were unreachable (the
    causes) and which only stopped because of them (named after the causes, never instead of them).
  - It never fails itself. The stage's role undoes its half-done work on every reachable host when
    RV(failed_hosts) is not empty, then fails with RV(message) - each stage with its own undo, in its own role.
author:
  - npuops maintainers (@npuops)
options:
  hosts:
    description: The hosts that ran the step.
    type: list
    elements: str
    required: true
  key:
    description: The name the step's task registered its result under.
    type: str
    required: true
  stage:
    description: The stage, as the message names it (C(The weights stage)).
    type: str
    required: true
  step:
    description: The step, as the message names it (C(starting the weight servers)).
    type: str
    required: true
  undone:
    description: What the stage's undo does, for the message.
    type: str
    required: true
  done_key:
    description:
      - "A key every successful result carries, for a step registered with C(failed_when: false) (which clears
        C(failed)); a result with a message and without it failed."
    type: str
attributes:
  check_mode:
    description: Reads results only; the roles skip the gate in check mode, where the steps do not run.
    support: full
  diff_mode:
    description: No diff.
    support: none
  action:
    description: Runs on the controller.
    support: full
seealso:
  - module: npuops.ascend.weight_stop
"""

EXAMPLES = r"""
- name: "Gate: find the hosts that failed starting the weight servers"
  npuops.ascend.stage_gate:
    hosts: "{{ ansible_play_hosts }}"
    key: npuops_weights_served
    stage: The weights stage
    step: starting the weight servers
    undone: the weight servers and copy jobs of this run were stopped on every reachable host
  register: npuops_gate_verdict
  run_once: true
"""

RETURN = r"""
failed_hosts:
  description: The hosts that failed the step (the causes; the hosts that stopped when no cause is known); empty when
    every host went fine.
  returned: always
  type: list
  elements: str
message:
  description: One message naming the stage, the step, each failed host and why, then the hosts that only stopped
    because of them; empty when every host went fine.
  returned: always
  type: str
"""
