"""status.yml and recover.yml on a 2-node simulated cluster (a leader and a headless worker: what status and recover
do is the same for every tier), as a platform polls them: the verdict per instance
(exit code and the stats), in bounded time whatever is broken; recover brings back exactly what is down."""
import re
import time

import ansible_runner
import pytest

from npuops_sim.testing import BIN, REPO, bring_up, env, run, sim

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 2)
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    for name in ("weights", "deploy"):
        run([BIN + "/ansible-playbook", "-i", c.inventory, "playbooks/%s.yml" % name], timeout=600)
    yield c
    sim("down", timeout=300)


def polled(c, tmp_path, playbook="status"):
    """The playbook through ansible-runner, as a platform runs it: -> (rc, seconds, stats npuops_status, stdout)."""
    data = tmp_path / ("runner-" + playbook)
    data.mkdir(exist_ok=True)
    t0 = time.time()
    r = ansible_runner.run(private_data_dir=str(data), project_dir=REPO,
                           playbook="playbooks/%s.yml" % playbook, inventory=c.inventory, quiet=True, timeout=600,
                           envvars=dict((k, v) for k, v in env().items() if k in ("ANSIBLE_CONFIG", "PATH",
                                                                                  "PYTHONPATH")))
    took = time.time() - t0
    text = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout.read())  # the runner keeps the callback's colours
    stats = [e for e in r.events if e.get("event") == "playbook_on_stats"][0]["event_data"]["artifact_data"]
    return r.rc, took, stats.get("npuops_status"), text


def test_a_healthy_service_is_healthy_and_exits_0(cluster, tmp_path):
    rc, took, status, out = polled(cluster, tmp_path)
    assert rc == 0 and took < 60, out[-3000:]
    assert status["healthy"] is True and status["state"] == "healthy"
    assert status["instances"]["main"]["state"] == "healthy"
    assert status["instances"]["main"]["hosts"] == ["node01", "node02"]
    # what the running engines' image holds, read on the nodes (the sim's image carries the package metadata of the
    # versions it emulates): the 2-node recipe's kimi-k3.1-pro-a3 is vLLM / vllm-ascend 0.23.0 on CANN 9.1.0
    image = status["instances"]["main"]["image"]
    ids = set(cluster.ssh(h, "podman inspect --format '{{.Image}}' vllm").stdout.strip() for h in ("node01", "node02"))
    assert len(ids) == 1 and ids.pop() in (image["id"] or "") and status["instances"]["main"]["image_problems"] == []
    assert image["versions"]["vllm"] == "0.23.0" and image["versions"]["cann"] == "9.1.0", image
    # the summary line as the operator reads it (the YAML callback wraps it anywhere), with what the instance serves
    line = " ".join(out.split())
    assert re.search(r"main: healthy \(node01, node02\) - a token in .*?; serves kimi-k3 from /srv/models/kimi-k3-w4a8 "
                     r"\[vLLM 0\.23\.0, vllm-ascend 0\.23\.0, torch_npu [^,]+, CANN 9\.1\.0; (sha256:)?[0-9a-f]{12,}\]",
                     line), out[-3000:]


@pytest.mark.parametrize("fault,node,expect", [
    ("stopped", "node02", r"node02: container vllm (exited|stopped)"),
    ("engine_hang", "node01", r"no token within 10s through node01"),
    ("engine_wedge", "node01", r"no token within 10s through node01 \(http://[\d.]+:8000\) although /health -> 200 "
                               r"answers \(a wedged engine\)"),
    # a collective hung on the worker's NPUs: its rank never finishes a step, so the leader's whole group stalls
    ("engine_wedge", "node02", r"no token within 10s through node01 \(http://[\d.]+:8000\) although /health -> 200 "
                               r"answers \(a wedged engine\)"),
    ("node_down", "node02", r"node02: unreachable"),
])
def test_a_fault_is_named_within_60s_and_recover_brings_the_instance_back(cluster, tmp_path, fault, node, expect):
    if fault == "stopped":
        cluster.ssh(node, "podman stop -t 2 vllm")
    else:
        sim("fault", "--node", node[-1], "--fault", fault)
    try:
        rc, took, status, out = polled(cluster, tmp_path)
    finally:
        if fault != "stopped":
            sim("fault", "--node", node[-1], "--fault", "clear")
    main = status["instances"]["main"]
    assert rc != 0 and took < 60, (took, out[-3000:])
    assert status["healthy"] is False and main["state"] in ("down", "degraded"), main
    assert re.search(expect, main["reason"]), main["reason"]
    assert "The service is %s" % status["state"] in out
    if main["state"] == "down":  # diagnose read the logs of the nodes that answer
        assert "Diagnosis (most likely first):" in out, out[-3000:]

    rc, took, _status, out = polled(cluster, tmp_path, "recover")
    assert rc == 0, out[-4000:]
    m = re.search(r"Recovered main/main in ([\d.]+)s; the service is healthy|Every instance is healthy", out)
    assert m, out[-3000:]
    rc, _took, status, out = polled(cluster, tmp_path)
    assert rc == 0 and status["healthy"], out[-3000:]


def test_validate_against_a_frozen_engine_fails_within_its_budget(cluster):
    sim("fault", "--node", "1", "--fault", "engine_hang")
    try:
        t0 = time.time()
        proc = run([BIN + "/ansible-playbook", "-i", cluster.inventory, "playbooks/validate.yml",
                    "-e", '{"npuops_validate_budget": 20, "npuops_validate_from": "localhost"}'], check=False,
                   timeout=300)
        took = time.time() - t0
    finally:
        sim("fault", "--node", "1", "--fault", "clear")
    assert proc.returncode != 0 and took < 90, (took, proc.stdout[-3000:])
    assert "Validate:" in proc.stdout and "not run: the checks' budget of 20s was spent" in proc.stdout


def test_recover_leaves_a_healthy_instance_untouched(cluster, tmp_path):
    before = cluster.started(["node01"])
    assert " running " in before["node01"], before
    rc, _took, _status, out = polled(cluster, tmp_path, "recover")
    assert rc == 0 and "Every instance is healthy: nothing to recover." in out
    assert cluster.started(["node01"]) == before
    assert re.search(r"node01\s+: ok=\d+\s+changed=0", out)
