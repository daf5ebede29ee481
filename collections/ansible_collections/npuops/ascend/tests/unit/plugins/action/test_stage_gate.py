# -*- coding: utf-8 -*-
"""The stage_gate action as the weights and serve roles' gates call it: run_once over hosts that registered a step,
through ansible-playbook (the results are real registered results, the verdict reaches every host)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 8))


def run_play(tmp_path, tasks):
    (tmp_path / "play.yml").write_text(json.dumps([{"hosts": "all", "connection": "local", "gather_facts": False,
                                                    "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "a,b,c",
                           "-e", "ansible_python_interpreter=%s" % sys.executable, str(tmp_path / "play.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def gate(**extra):
    args = {"hosts": "{{ ansible_play_hosts }}", "key": "npuops_step", "stage": "The weights stage",
            "step": "starting the weight servers", "undone": "the weight servers of this run were stopped"}
    args.update(extra)
    return {"name": "Gate", "npuops.ascend.stage_gate": args, "register": "npuops_gate_verdict", "run_once": True}


def write_verdict(tmp_path):
    return {"name": "Keep what each host sees", "ansible.builtin.copy": {
        "content": "{{ npuops_gate_verdict | to_json }}", "dest": str(tmp_path) + "/{{ inventory_hostname }}.json",
        "mode": "0600"}}


def test_the_gate_names_the_host_that_failed_and_every_host_sees_the_verdict(tmp_path):
    step = {"name": "A step that fails on b", "ansible.builtin.fail": {"msg": "no space left on /data"},
            "when": "inventory_hostname == 'b'", "register": "npuops_step", "ignore_errors": True}
    run = run_play(tmp_path, [step, gate(), write_verdict(tmp_path)])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    seen = dict((h, json.loads((tmp_path / ("%s.json" % h)).read_text())) for h in "abc")
    assert all(v["failed_hosts"] == ["b"] for v in seen.values()), seen
    assert seen["c"]["message"] == ("The weights stage failed (starting the weight servers) on 1 host(s); the weight "
                                    "servers of this run were stopped:\n- b: no space left on /data")
    assert not seen["a"].get("failed") and not seen["a"]["changed"]


def test_a_step_registered_without_failing_is_judged_by_its_done_key(tmp_path):
    step = {"name": "A wait registered with failed_when false", "ansible.builtin.set_fact": {"x": 1},
            "register": "npuops_step"}
    said = {"name": "What the wait said on c", "ansible.builtin.set_fact": {
        "npuops_step": "{{ {'msg': 'engine exited (rc 1)'} if inventory_hostname == 'c' else "
                       "{'ready_after': 3, 'msg': 'up'} }}"}}
    run = run_play(tmp_path, [step, said, gate(done_key="ready_after"), write_verdict(tmp_path)])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    verdict = json.loads((tmp_path / "a.json").read_text())
    assert verdict["failed_hosts"] == ["c"] and verdict["message"].endswith("- c: engine exited (rc 1)")
    fine = run_play(tmp_path, [step, gate(), write_verdict(tmp_path)])
    assert fine.returncode == 0 and json.loads((tmp_path / "b.json").read_text())["failed_hosts"] == []
