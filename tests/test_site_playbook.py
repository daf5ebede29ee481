"""The whole journey on a 4-node simulated cluster, the way a platform runs it: playbooks/site.yml through
ansible_runner.run, the outcome read from the stats; then the report, the example script, a re-run that changes
nothing and a foreign listener preflight names (validate catching garbage answers: tests/test_validate_playbook.py)."""
import glob
import json
import os
import re
import subprocess
import sys

import ansible_runner
import pytest
from matplotlib import image as mpimg

from npuops_sim.testing import BIN, REPO, bring_up, env, run, sim

pytestmark = pytest.mark.sim

CHECKS = {"health", "models", "chat", "reasoning", "tool_call", "image", "long_prompt", "stream"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 4)
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    c.reports = str(tmp_path_factory.mktemp("reports"))
    yield c
    sim("down", timeout=300)


@pytest.fixture(scope="module")
def checked(cluster):
    """site.yml --check --diff on the fresh cluster, before anything is deployed."""
    return run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/site.yml", "--check", "--diff",
                "--skip-tags", "bench", "-e", json.dumps({"npuops_reports_dir": cluster.reports})], check=False,
               timeout=900)


@pytest.fixture(scope="module")
def site(cluster, checked, tmp_path_factory):
    """site.yml once, through ansible-runner, as a platform would call it (after the check-mode run)."""
    data_dir = str(tmp_path_factory.mktemp("runner"))
    runner = ansible_runner.run(
        private_data_dir=data_dir, project_dir=REPO, playbook="playbooks/site.yml", inventory=cluster.inventory,
        extravars={"npuops_bench_matrix": "sim", "npuops_reports_dir": cluster.reports},
        envvars=dict((k, v) for k, v in env().items() if k in ("ANSIBLE_CONFIG", "PATH", "PYTHONPATH")),
        quiet=True, timeout=1200)
    stats_event = [e for e in runner.events if e.get("event") == "playbook_on_stats"]
    return runner, stats_event[0]["event_data"]["artifact_data"]["npuops"]


def test_check_mode_on_a_fresh_cluster_shows_what_it_would_create_and_starts_nothing(cluster, checked):
    out = checked.stdout
    assert checked.returncode == 0, out[-4000:]
    for node in ("node01", "node02", "node03", "node04"):
        assert "%s (create): (all): (unset) -> created" % node in out
        assert cluster.ssh(node, "podman ps -a --format '{{.Names}}'").stdout.strip() == ""
    assert re.search(r"\+\s+--data-parallel-start-rank: '2'", out)  # the diff shows the container, flag by flag


def test_site_through_ansible_runner_reports_every_stage(cluster, site):
    runner, outcome = site
    assert runner.status == "successful", runner.stdout.read()[-3000:]
    assert runner.rc == 0
    assert runner.stats["failures"] == {} and runner.stats["dark"] == {}
    assert set(runner.stats["processed"]) == {"node01", "node02", "node03", "node04"}

    assert outcome["ok"] is True and outcome["failed"] is None
    assert outcome["tier"] == "4node_dp" and outcome["model"] == "kimi-k3"
    assert outcome["endpoint"] == "http://%s:8000" % cluster.ip("node01")
    assert outcome["nodes"] == ["node01", "node02", "node03", "node04"]
    assert outcome["preflight"]["go"] is True and outcome["preflight"]["failures"] == []
    assert outcome["weights"]["seed"] == "node01" and outcome["weights"]["total_bytes"] > 32 * 2 ** 20
    assert sorted(outcome["weights"]["copied_to"]) == ["node02", "node03", "node04"]
    assert outcome["validate"]["ok"] is True
    assert {c["name"] for c in outcome["validate"]["checks"] if c["ok"]} == CHECKS
    # the accuracy stage: every golden item answered right by the instance, every API check passed
    main = outcome["accuracy"]["instances"]["main"]
    assert outcome["accuracy"]["ok"] is True and main["score"] == 100.0 and main["baseline"] == 100.0
    assert main["samples"]["completed"] == main["samples"]["total"] == 64 and main["api_failed"] == []
    assert outcome["bench"]["ok"] is True
    assert outcome["bench_report"].startswith(cluster.reports) and os.path.isfile(outcome["bench_report"])
    # the recipe deployed and what each node's image holds (read by preflight from its package metadata)
    assert outcome["recipe"] == "kimi_k3_tutorial_4node_a3"
    assert sorted(outcome["images"]) == ["node01", "node02", "node03", "node04"]
    held = outcome["images"]["node03"]
    assert held["versions"]["vllm"] == "0.27.1" and held["versions"]["vllm_ascend"] == "main"
    assert held["versions"]["cann"] == "9.1.0" and held["id"]
    assert len(set((i["digest"] or i["id"]) for i in outcome["images"].values())) == 1
    meta = json.load(open(os.path.join(outcome["bench"]["report_dir"], "meta.json")))
    assert meta["recipe"] == "kimi_k3_tutorial_4node_a3" and meta["images"] == outcome["images"]

    # per-host events: every node ran the preflight checks and started its engine
    for host in ("node01", "node02", "node03", "node04"):
        tasks = [e["event_data"]["task"] for e in runner.host_events(host) if e["event"] == "runner_on_ok"]
        assert any("NPU" in t for t in tasks), (host, tasks)
        assert any(t.startswith("Start the") for t in tasks), (host, tasks)


def test_the_bench_report_adds_up_and_its_plots_open(site):
    _runner, outcome = site
    report_dir = outcome["bench"]["report_dir"]
    text = open(outcome["bench_report"]).read()
    assert "## Reconciliation: adds up" in text
    for series in ("random-256x64", "agentic-2k"):
        assert "## %s" % series in text
    pngs = sorted(glob.glob(os.path.join(report_dir, "*.png")))
    assert [os.path.basename(p) for p in pngs] == sorted(
        ["throughput_vs_concurrency.png", "per_user_vs_total.png", "latency_percentiles.png"])
    for png in pngs:
        pixels = mpimg.imread(png)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 300 and pixels.std() > 0.01  # drawn, not blank
    raw = sorted(glob.glob(os.path.join(report_dir, "raw", "*.json")))
    points = [json.load(open(p)) for p in raw]
    assert [p["npuops"]["point"]["name"] for p in points] == [r["point"] for r in outcome["bench"]["table"]]
    lines = [json.loads(line) for line in open(os.path.join(report_dir, "requests.jsonl"))]
    assert len(lines) == sum(p["npuops"]["planned"]["requests"] for p in points)
    multi = [p for p in points if p["npuops"]["point"]["kind"] == "multi_turn"]
    assert multi and all(p["npuops"]["prefix_cache_hit_rate"] > 0.5 for p in multi)  # the turns reuse the prefix


def recheck(report_dir):
    return run([BIN + "/ansible", "localhost", "-m", "npuops.ascend.bench_report", "-a",
                "report_dir=%s" % report_dir], check=False, timeout=120)


def test_a_corrupted_saved_result_fails_the_reconciliation(site, tmp_path):
    _runner, outcome = site
    copy = tmp_path / "report"
    subprocess.run(["cp", "-a", outcome["bench"]["report_dir"], str(copy)], check=True)
    assert recheck(copy).returncode == 0

    victim = sorted(glob.glob(str(copy / "raw" / "*agentic-2k-c2.json")))[0]
    result = json.load(open(victim))
    result["completed"] += 1  # one more success than requests were sent
    json.dump(result, open(victim, "w"))
    proc = recheck(copy)
    assert proc.returncode != 0
    assert "does not add up" in proc.stdout and "agentic-2k-c2" in proc.stdout
    assert "succeeded" in proc.stdout and "sent" in proc.stdout


def test_the_example_script_drives_a_stage_and_prints_the_outcome(cluster, tmp_path):
    extra = tmp_path / "extra.yml"  # -e @FILE, as the docs show for secrets
    extra.write_text("npuops_reports_dir: %s\n" % cluster.reports)
    proc = subprocess.run(
        [sys.executable, "examples/runner_rollout.py", "-i", cluster.inventory, "--tags", "validate",
         "--private-data-dir", str(tmp_path / "runner"), "-e", "@%s" % extra],
        cwd=REPO, env=env(), text=True, capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "successful"
    assert out["npuops"]["validate"]["ok"] is True
    assert out["npuops"]["preflight"] is None and out["npuops"]["bench"] is None  # skipped by tag
    assert "status   successful" in proc.stderr
    assert "ok       node01" in proc.stderr  # the per-task stream


def started(c):
    return c.started(("node01", "node02", "node03", "node04"))


def test_site_run_again_unchanged_changes_nothing_restarts_nothing_and_moves_no_weight_byte(cluster, site,
                                                                                          tmp_path):
    """The inventory-driven rollout: the project's own main command converges a running cluster."""
    before = started(cluster)
    assert all(" running " in s for s in before.values()), before
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path), project_dir=REPO, playbook="playbooks/site.yml", inventory=cluster.inventory,
        extravars={"npuops_reports_dir": cluster.reports}, cmdline="--skip-tags bench",
        envvars=dict((k, v) for k, v in env().items() if k in ("ANSIBLE_CONFIG", "PATH", "PYTHONPATH")),
        quiet=True, timeout=1200)
    out = runner.stdout.read()
    assert runner.status == "successful", out[-4000:]
    assert runner.stats["changed"] == {} and runner.stats["failures"] == {}, runner.stats
    outcome = [e for e in runner.events if e.get("event") == "playbook_on_stats"][0]["event_data"]["artifact_data"][
        "npuops"]
    assert outcome["ok"] and outcome["weights"]["copied_to"] == [] and outcome["deploy"]["restarted"] == []
    assert outcome["preflight"]["go"] and outcome["preflight"]["failures"] == []
    assert "port_free (service)" in out and "held by the service" in out  # its own ports are known as its own
    assert started(cluster) == before


CHANGE = {"npuops_model_overrides": {"weights_bytes": 4000000000, "max_num_seqs": 8}}


def site_run(cluster, *extra):
    return run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/site.yml"] + list(extra), check=False,
               timeout=900)


def test_a_change_refused_for_lack_of_downtime_stops_no_engine(cluster, site, tmp_path):
    """site.yml refuses a change that would restart the only serving instance; its failure path must not stop the
    engines it would have restarted: every one serves on, with the same start time."""
    before = started(cluster)
    assert all(" running " in s for s in before.values()), before
    proc = site_run(cluster, "--skip-tags", "bench,monitor", "-e", json.dumps(dict(
        CHANGE, npuops_reports_dir=str(tmp_path))))
    assert proc.returncode != 0 and "the update interrupts service" in proc.stdout, proc.stdout[-3000:]
    assert started(cluster) == before


def test_a_bench_failure_after_a_restart_leaves_the_restarted_engines_serving(cluster, site, tmp_path):
    """The change is allowed and rolled out; the bench then fails: the engines this run restarted came up and serve,
    so the failure is reported and they keep serving."""
    before = started(cluster)
    proc = site_run(cluster, "--skip-tags", "monitor", "-e", json.dumps(dict(
        CHANGE, npuops_rollout_allow_downtime=True, npuops_bench_matrix="no-such-matrix",
        npuops_reports_dir=str(tmp_path))))
    assert proc.returncode != 0 and "no-such-matrix is not one of npuops_bench_matrices" in proc.stdout, \
        proc.stdout[-3000:]
    after = started(cluster)
    assert all(after[n] != before[n] and " running " in after[n] for n in after), after
    status = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/status.yml", "-e", json.dumps(CHANGE)],
                 check=False, timeout=300)
    assert status.returncode == 0 and "service: healthy" in status.stdout, status.stdout[-3000:]


def test_garbled_answers_fail_the_accuracy_stage_naming_the_instance_and_status_says_wrong_until_measured_right(
        cluster, site):
    """An engine that answers junk with HTTP 200 (multi-node garbled output): the one-token health of status.yml
    cannot tell, the accuracy stage does, naming the instance, the dataset, the score and the baseline; its verdict
    on the running configuration lasts, so status calls the service wrong (not healthy) until a measurement of the
    same configuration passes."""
    sim("fault", "--node", "1", "--fault", "garbled")
    try:
        accuracy = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/accuracy.yml",
                        "-e", json.dumps(CHANGE)], check=False, timeout=600)
        status = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/status.yml",
                      "-e", json.dumps(CHANGE)], check=False, timeout=300)
    finally:
        sim("fault", "--node", "1", "--fault", "clear")
    text = " ".join(accuracy.stdout.split())
    assert accuracy.returncode != 0, text[-3000:]
    assert "Accuracy: instance main: golden score 0.00 is outside baseline 100.00 +- 5.00 (0 of 64 correct, 0 failed, " \
           "0 missing, 64 unparsed)" in text, text[-3000:]
    said = " ".join(status.stdout.split())
    assert status.returncode != 0 and "The service is wrong: main: wrong (node01, node02, node03, node04) - answers " \
        "wrongly: its running configuration" in said and "golden score 0.00 is outside baseline" in said, said[-3000:]
    healthy = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/accuracy.yml",
                   "-e", json.dumps(CHANGE)], check=False, timeout=600)
    assert healthy.returncode == 0 and "main: ok golden 100.0/100" in " ".join(healthy.stdout.split()), \
        healthy.stdout[-3000:]
    status = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/status.yml", "-e", json.dumps(CHANGE)],
                 check=False, timeout=300)
    assert status.returncode == 0 and "service: healthy" in status.stdout, status.stdout[-3000:]


def test_a_foreign_listener_on_a_tier_port_still_fails_preflight_naming_the_process(cluster, tmp_path):
    """...and on the inventory's Prometheus port (npuops_monitor_prometheus_port, not 9090) of the monitor host."""
    run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/stop.yml"], timeout=300)
    sim("fault", "--node", "1", "--fault", "port_busy", "--port", "8000")
    sim("fault", "--node", "1", "--fault", "port_busy", "--port", "9191")
    try:
        pids = dict((h["port"], h["pid"]) for h in cluster.state["helpers"] if h["what"] == "port_busy")
        proc = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/preflight.yml",
                    "-e", "npuops_reports_dir=%s" % tmp_path, "-e", "npuops_monitor_prometheus_port=9191"],
                   check=False, timeout=600)
    finally:
        sim("fault", "--node", "1", "--fault", "clear")
    assert proc.returncode != 0
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert sorted((f["host"], f["check"], f["observed"]) for f in report["failures"]) == [
        ("node01", "port_free", "port 8000 is in use by %d (python3)" % pids[8000]),
        ("node01", "port_free", "port 9191 is in use by %d (python3)" % pids[9191])]
