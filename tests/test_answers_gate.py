"""Never serve a wrong answer: the accuracy gate's verdict holds until a measurement proves otherwise, on every path
that puts an instance into rotation. Two 2-node instances behind the real gateway pair (what the gate does is the
same for every tier), clients asking questions whose answers are known through the floating address the whole time:
no wrong answer may reach them. A rollout whose change breaks the answers stops at the first instance, which gets the
configuration that answered right back; an instance whose every configuration answers junk stays out through
status (`wrong`), recover and gateway.yml until it answers right; an interrupted rollout's instance is judged before
it serves again; a baseline the gate could not judge is refused before anything changes.
One cluster for the module; the tests run in file order."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from npuops_sim.testing import BIN, REPO, bring_up, env, playbook, run, sim
from service_clients import Load, Questions, admin_rows, complete, runner

pytestmark = pytest.mark.sim

INSPECT = "podman inspect --format '{{json .Config.Cmd}}' vllm"
# the simulated engines start in seconds: 3 s of settling is plenty here (the default is 25)
QUICK = {"npuops_serve_settle_seconds": 3}
# a KV cache of more blocks than a kernel's int32 offset holds answers junk with HTTP 200 (vllm-ascend #16870)
BREAKS_ANSWERS = dict(QUICK, npuops_vllm_overrides={"max_num_seqs": 8, "block_size": 64})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 4, "a3", "--replicas", "2")
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    # the accuracy stage records each instance's first verdict (its configuration passed)
    rc, out, _stats = runner(c, tmp_path_factory.mktemp("site"), "site", "--skip-tags bench,preflight")
    assert rc == 0, out[-4000:]
    c.vip = c.state["nodes"]["gw01"]["mgmt_ip"].rsplit(".", 1)[0] + ".250"
    c.url = "http://%s:8000" % c.vip
    yield c
    sim("down", timeout=300)


def vars_file(tmp_path, name, data):
    f = tmp_path / name
    f.write_text(json.dumps(data))
    return "@%s" % f


def in_the_background(cluster, tmp_path, name, extra):
    """rollout.yml in its own session (so a Ctrl-C reaches all of it), its output in a file: -> (process, log path)."""
    log_path = str(tmp_path / (name + ".log"))
    log = open(log_path, "w")
    play = subprocess.Popen([BIN + "/ansible-playbook", "-i", cluster.inventory, "-e", extra, "playbooks/rollout.yml"],
                            cwd=REPO, env=env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    return play, log_path


def wait_for(what, condition, timeout, play=None, log_path=None):
    deadline = time.monotonic() + timeout
    while not condition():
        if play is not None and play.poll() is not None:
            raise AssertionError("the play ended before %s:\n%s" % (what, open(log_path).read()[-3000:]))
        if time.monotonic() > deadline:
            raise AssertionError("no %s within %ds" % (what, timeout))
        time.sleep(0.2)


def interrupt(play):
    """The operator's Ctrl-C, again if the play goes on (ansible-core can lose one), then bounded."""
    try:
        for _ in range(3):
            os.killpg(play.pid, signal.SIGINT)
            try:
                play.wait(3)
                break
            except subprocess.TimeoutExpired:
                pass
        play.wait(60)
    finally:
        if play.poll() is None:
            os.killpg(play.pid, signal.SIGKILL)


def test_a_baseline_the_gate_could_not_judge_is_refused_before_anything_changes(cluster, tmp_path):
    """plan.yml and a rollout refuse it naming the variable: the rollout drains nothing (before, the gate failed after
    the drain with a filter's traceback and left the instance drained on an unjudged configuration)."""
    bad = vars_file(tmp_path, "bad.json", dict(QUICK, npuops_vllm_overrides={"max_num_seqs": 8},
                                               npuops_accuracy_baselines={"default": {"golden": {"baseline": "abc"}}}))
    nodes = ["node01", "node02", "node03", "node04"]
    started = cluster.started(nodes)
    for name in ("plan", "rollout"):
        proc = playbook(cluster, name, "-e", bad, check=False)
        text = " ".join(proc.stdout.split())
        assert proc.returncode != 0, text[-3000:]
        assert "npuops_accuracy_baselines.default.golden.baseline must be a number of points (0 to 100), not 'abc'" \
            in text, text[-3000:]
        assert "Drain at the gateway" not in text
    assert cluster.started(nodes) == started
    assert admin_rows(cluster, "gw01") == {"a-1": "UP", "b-1": "UP"}


def test_a_rollout_that_breaks_answers_stops_at_the_first_instance_which_gets_its_configuration_back(cluster):
    """The change makes the engines answer junk with HTTP 200: the accuracy gate stops the rollout at instance a,
    which gets the configuration it ran back and returns to rotation; b is never touched and no request fails."""
    a_argv = json.loads(cluster.ssh("node01", INSPECT).stdout)
    a_started, b_started = cluster.started(["node01", "node02"]), cluster.started(["node03", "node04"])
    with Load(cluster.url) as load:
        proc = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "-e", json.dumps(BREAKS_ANSWERS),
                    "playbooks/rollout.yml"], check=False, timeout=900)
    text = " ".join(proc.stdout.split())
    assert proc.returncode != 0, text[-3000:]
    assert "Rolling update stopped at instance a: its new configuration answers wrongly (instance a: golden score " \
           "0.00 is outside baseline 100.00 +- 5.00" in text, text[-3000:]
    assert "Its previous configuration is restored and back in rotation. Instances not reached: b." in text
    assert "(Restored: the configuration it ran before, which passed its gates.)" in text
    assert load.failed == 0, [r for r in load.results if r[2] != 200][:5]
    assert cluster.started(["node03", "node04"]) == b_started  # b untouched
    a_now = cluster.started(["node01", "node02"])
    assert all(a_now[n] != a_started[n] and " running " in a_now[n] for n in a_now), a_now  # restarted twice
    assert json.loads(cluster.ssh("node01", INSPECT).stdout) == a_argv  # with the configuration it ran before
    deadline = time.monotonic() + 15
    while complete(cluster.url)[1] != "a-1" and time.monotonic() < deadline:  # active_standby: a serves again
        time.sleep(0.5)
    assert complete(cluster.url)[1] == "a-1"


def test_an_interrupted_rollouts_instance_is_judged_before_it_serves_again(cluster, tmp_path):
    """Ctrl-C while instance a's new configuration (one that answers junk) is measured; the next run of the same
    rollout does not put a back on it: it measures it, gives a the last configuration that passed, puts it back and
    stops naming why. Before, the rerun put a back unmeasured and the users got junk from it."""
    extra = json.dumps(BREAKS_ANSWERS)
    a_argv = json.loads(cluster.ssh("node01", INSPECT).stdout)
    b_started = cluster.started(["node03", "node04"])
    with Questions(cluster.url) as questions:
        play, log_path = in_the_background(cluster, tmp_path, "interrupted", extra)
        try:
            wait_for("measurement of instance a", lambda: "the accuracy gate) - instance a" in open(log_path).read(),
                     300, play, log_path)
        finally:
            interrupt(play)
        assert admin_rows(cluster, "gw01")["a-1"] in ("DRAIN", "MAINT")
        assert json.loads(cluster.ssh("node01", INSPECT).stdout) != a_argv  # a runs the new, never judged one
        proc = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "-e", extra, "playbooks/rollout.yml"],
                   check=False, timeout=900)
        time.sleep(2)
    text = " ".join(proc.stdout.split())
    print("interrupted rollout, then its rerun: answers=%d wrong=%d failed=%d" % (
        len(questions.answered), len(questions.wrong), questions.failed))
    assert proc.returncode != 0, text[-3000:]
    assert "a: measured before it may serve (its running configuration (cfg-" in text, text[-3000:]
    assert "Rolling update stopped at instance a: its new configuration answers wrongly" in text, text[-3000:]
    assert "Its previous configuration is restored and back in rotation." in text
    assert "(Restored: the last configuration that passed its gates (cfg-" in text
    assert questions.wrong == [], questions.wrong[:5]
    assert questions.failed == 0 and len(questions.answered) > 50
    assert json.loads(cluster.ssh("node01", INSPECT).stdout) == a_argv
    assert cluster.started(["node03", "node04"]) == b_started  # b untouched
    for gw in ("gw01", "gw02"):
        assert admin_rows(cluster, gw) == {"a-1": "UP", "b-1": "UP"}


def test_an_instance_out_for_its_answers_stays_out_through_status_recover_and_gateway_until_it_answers_right(
        cluster, tmp_path):
    """Instance a answers junk whatever it runs (its node computes wrong): the rollout stops at a, whose previous
    configuration answers junk too, so a stays out. status.yml calls it wrong (non-zero), recover.yml measures it and
    leaves it out naming why (before, recover put it back: 191 wrong answers of 421), gateway.yml's reload keeps it
    out; once its node is fixed, recover measures it and puts it back. No wrong answer reaches a user meanwhile."""
    change = dict(QUICK, npuops_vllm_overrides={"max_num_seqs": 8})
    rolled = vars_file(tmp_path, "change.json", change)
    b_started = cluster.started(["node03", "node04"])
    try:
        with Questions(cluster.url) as questions:
            play, log_path = in_the_background(cluster, tmp_path, "rollout", json.dumps(change))
            try:
                # the node goes wrong once a is out of rotation: before, a served right
                wait_for("a drained", lambda: admin_rows(cluster, "gw01").get("a-1") != "UP", 300, play, log_path)
                sim("fault", "--node", "1", "--fault", "garbled")
                play.wait(900)
            finally:
                if play.poll() is None:
                    interrupt(play)
            text = " ".join(open(log_path).read().split())
            assert play.returncode != 0, text[-3000:]
            assert "Rolling update stopped at instance a: its new configuration answers wrongly" in text, text[-3000:]
            assert "Its previous configuration is restored but answers wrongly too" in text
            assert "so it stays out of rotation; the other instances serve. Instances not reached: b." in text
            assert admin_rows(cluster, "gw01")["a-1"] in ("DRAIN", "MAINT")

            rc, out, stats = runner(cluster, tmp_path, "status", "-e %s" % rolled)
            a = stats["npuops_status"]["instances"]["a"]
            assert rc != 0 and a["state"] == "wrong", out[-3000:]
            assert a["reason"].startswith("answers wrongly: its running configuration (cfg-") and \
                "failed the answers gate at " in a["reason"], a
            assert stats["npuops_status"]["instances"]["b"]["state"] == "healthy"

            a_started = cluster.started(["node01", "node02"])
            rc, out, _stats = runner(cluster, tmp_path, "recover", "-e %s" % rolled)
            flat = " ".join(out.split())
            assert rc != 0, flat[-3000:]
            assert "a: stays out of rotation: measured now: golden score 0.00 is outside baseline" in flat, flat[-3000:]
            assert "a: wrong" in flat and "Recovered" not in flat
            assert cluster.started(["node01", "node02"]) == a_started  # a restart changes no answer: none
            assert admin_rows(cluster, "gw01")["a-1"] in ("DRAIN", "MAINT")

            # the gateway alone, with a change that reloads HAProxy on both hosts: a reload starts every server
            # ready unless its state is kept - a stays out
            proc = playbook(cluster, "gateway", "-l", "gateway", "-e", rolled, "-e",
                            '{"npuops_gateway_mode": "active_active"}', check=False)
            assert proc.returncode == 0, proc.stdout[-3000:]
            for gw in ("gw01", "gw02"):
                assert admin_rows(cluster, gw)["a-1"] in ("DRAIN", "MAINT"), admin_rows(cluster, gw)
        print("instance out for its answers: answers=%d wrong=%d failed=%d" % (
            len(questions.answered), len(questions.wrong), questions.failed))
        assert questions.wrong == [], questions.wrong[:5]
        assert len(questions.answered) > 50 and "b-1" in {r[3][0] for r in questions.answered}
    finally:
        sim("fault", "--node", "1", "--fault", "clear")
    # fixed: recover measures a (its answers are right now), and it serves again
    rc, out, _stats = runner(cluster, tmp_path, "recover", "-e %s" % rolled)
    flat = " ".join(out.split())
    assert rc == 0 and "a: measured now, back into rotation (golden 100.0" in flat, flat[-3000:]
    assert re.search(r"Recovered rotation of a in [\d.]+s; the service is healthy", flat), flat[-3000:]
    assert cluster.started(["node03", "node04"]) == b_started
    for gw in ("gw01", "gw02"):
        assert admin_rows(cluster, gw) == {"a-1": "UP", "b-1": "UP"}


def test_the_accuracy_stage_takes_out_an_instance_it_finds_answering_wrongly(cluster, tmp_path):
    """Both instances serve (the gateway left active_active by the test before). b's node starts computing wrong while
    b is in rotation: no gate can know until it measures, and the accuracy stage then takes b out of rotation (it
    fails naming b); from then on no wrong answer is served, status calls b wrong, and once fixed recover puts it
    back."""
    assert admin_rows(cluster, "gw01") == {"a-1": "UP", "b-1": "UP"}
    mode = vars_file(tmp_path, "mode.json", dict(QUICK, npuops_vllm_overrides={"max_num_seqs": 8},
                                                 npuops_gateway_mode="active_active"))
    sim("fault", "--node", "3", "--fault", "garbled")
    try:
        proc = playbook(cluster, "accuracy", "-e", mode, check=False)
        text = " ".join(proc.stdout.split())
        assert proc.returncode != 0 and "Accuracy: instance b: golden score 0.00 is outside baseline" in text, \
            text[-3000:]
        assert "b: out of rotation: its running configuration (cfg-" in text, text[-3000:]
        for gw in ("gw01", "gw02"):
            assert admin_rows(cluster, gw)["b-1"] in ("DRAIN", "MAINT")
        with Questions(cluster.url) as questions:
            time.sleep(8)
        assert questions.wrong == [] and len(questions.answered) > 20, questions.results[:5]
        rc, out, stats = runner(cluster, tmp_path, "status", "-e %s" % mode)
        assert rc != 0 and stats["npuops_status"]["instances"]["b"]["state"] == "wrong", out[-3000:]
    finally:
        sim("fault", "--node", "3", "--fault", "clear")
    rc, out, _stats = runner(cluster, tmp_path, "recover", "-e %s" % mode)
    assert rc == 0 and "b: measured now, back into rotation" in " ".join(out.split()), out[-3000:]
    assert admin_rows(cluster, "gw01") == {"a-1": "UP", "b-1": "UP"}
