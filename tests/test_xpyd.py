"""xPyD: the prefill/decode tier at another ratio than 8P8D, taken from the inventory (npuops_prefill_nodes /
npuops_decode_nodes; the A3 planning article: prefill and decode scale independently). Four prefill and two decode
nodes on six simulated A3 nodes: the ranks, the connector's description of both sides and the proxy's lists follow
from 4 and 2, and the service validates through its proxy. Then the memcache KV pool of the same recipe (the Kimi-K3
page's 8P8D prefill side: a MetaService first, then prefill engines with AscendStoreConnector), and a MetaService that
dies while the prefill engines load."""
import json
import re
import subprocess
import time
import urllib.request

import pytest

from npuops_sim.testing import BIN, REPO, bring_up, env, plan_of, playbook, sim

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 6, "a3", "--tier", "8p8d_pd", "--prefill-nodes", "4")
    sim("weights", "--node", "1", "--size", "16M", "--files", "2")
    yield c
    sim("down", timeout=300)


def test_4p2d_deploys_with_its_own_ranks_and_lists_and_validates_through_the_proxy(cluster, tmp_path):
    plan = plan_of(cluster, tmp_path)
    assert plan["tier"] == "8p8d_pd" and plan["instances"]["main"]["shape"] == "4P2D" and len(plan["hosts"]) == 6
    playbook(cluster, "weights")
    playbook(cluster, "deploy")
    both = {"prefill": {"dp_size": 4, "tp_size": 16}, "decode": {"dp_size": 2, "tp_size": 16}}
    for node, size, rank in (("node04", "4", "3"), ("node06", "2", "1")):
        argv = json.loads(cluster.ssh(node, "podman inspect --format '{{json .Config.Cmd}}' vllm").stdout)
        assert argv[argv.index("--data-parallel-size") + 1] == size
        assert argv[argv.index("--data-parallel-rank") + 1] == rank
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"] == both
    proxy = json.loads(cluster.ssh("node01", "podman inspect --format '{{json .Config.Cmd}}' vllm-pd-proxy").stdout)
    addresses = [cluster.ip("node%02d" % i) for i in range(1, 7)]
    assert proxy[proxy.index("--prefiller-hosts") + 1:proxy.index("--prefiller-ports")] == addresses[:4]
    assert proxy[proxy.index("--decoder-hosts") + 1:proxy.index("--decoder-ports")] == addresses[4:]
    checks = playbook(cluster, "validate").stdout
    assert "FAIL" not in checks and "chat         ok " in checks, checks[-3000:]
    assert plan["endpoint"] == "http://%s:8080" % addresses[0]  # the proxy is the front door validate went through


POOL = {"npuops_kv_pool": "memcache", "npuops_rollout_allow_downtime": True}
PREFILL = ["node01", "node02", "node03", "node04"]


def started_at(cluster, node, name):
    return cluster.ssh(node, "podman inspect %s --format '{{.State.StartedAt}}'" % name).stdout.strip()


def test_the_kv_pool_starts_its_metaservice_before_the_prefill_engines_and_validates(cluster):
    playbook(cluster, "deploy", "-e", json.dumps(POOL))
    meta = started_at(cluster, "node01", "vllm-kv-pool-meta")
    assert all(started_at(cluster, n, "vllm") > meta for n in PREFILL)  # ISO times of one clock
    conf = cluster.ssh("node03", "cat /etc/npuops/mmc-local.conf").stdout
    assert "ock.mmc.meta_service_url = tcp://%s:5000\n" % cluster.ip("node01") in conf
    assert "memcache store initialized" in cluster.ssh("node03", "podman logs vllm 2>&1").stdout
    checks = playbook(cluster, "validate", "-e", json.dumps(POOL)).stdout
    assert "FAIL" not in checks and "chat         ok " in checks, checks[-3000:]
    # the MetaService's metrics where the Prometheus job memcache_meta scrapes them (its metrics_url, GET /metrics):
    # the four prefill engines' stores have mounted
    meta_url = "http://%s:8090" % cluster.ip("node01")
    with urllib.request.urlopen(meta_url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert re.search(r"^memcache_mount_requests_total (\d+)$", metrics, re.M), metrics
    assert int(re.search(r"^memcache_mount_requests_total (\d+)$", metrics, re.M).group(1)) >= 4
    with urllib.request.urlopen(meta_url + "/health", timeout=10) as r:
        assert json.loads(r.read())["status"] == "ok"
    # status covers the MetaService: down, it is named
    cluster.ssh("node01", "podman kill vllm-kv-pool-meta")
    out = playbook(cluster, "status", "-e", json.dumps(POOL), check=False)
    assert out.returncode != 0 and "node01: container vllm-kv-pool-meta exited" in out.stdout, out.stdout[-3000:]


def test_a_metaservice_killed_while_the_prefill_engines_load_fails_the_deploy_naming_it(cluster, tmp_path):
    """The deploy starts the MetaService (down since the last test) and waits until it listens, then the engines;
    the MetaService is killed while they load, so the prefill engines cannot join the pool: the deploy fails naming
    the cause and the fix, and stops the engines it started."""
    slow = dict(POOL, npuops_env_overrides={"NPUOPS_SIM_LOAD_SECONDS": "20"})
    log = tmp_path / "deploy.log"
    with open(str(log), "w") as out:
        play = subprocess.Popen([BIN + "/ansible-playbook", "-i", cluster.inventory, "-e", json.dumps(slow),
                                 "playbooks/deploy.yml"], cwd=REPO, env=env(), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "NPUOPS_SIM_LOAD_SECONDS=20" not in cluster.ssh(
                "node02", "podman inspect vllm --format '{{.Config.Env}}'", check=False).stdout:
            assert time.monotonic() < deadline and play.poll() is None, log.read_text()[-3000:]
            time.sleep(1)
        cluster.ssh("node01", "podman kill vllm-kv-pool-meta")
        rc = play.wait(300)
    finally:
        if play.poll() is None:
            play.kill()
    text = " ".join(log.read_text().split())
    assert rc != 0
    assert "kv_pool" in text and "could not join the memcache KV pool" in text, text[-4000:]
    assert "failed to connect to meta service tcp://%s:5000" % cluster.ip("node01") in text
    # what this run started is stopped (the one failure path)
    assert all(" running " not in s for s in cluster.started(PREFILL).values())
