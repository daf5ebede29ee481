"""playbooks/validate.yml and bench.yml on the 2-node TP16xPP2 simulated cluster: a healthy service passes
every check and benchmarks into a report that adds up; one node without /etc/hccn.conf makes it answer
garbage and the chat check fails."""
import glob
import json
import os

import pytest

from npuops_sim.testing import assert_validate_catches_missing_hccn_conf, bring_up, playbook, sim

pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = bring_up(tmp_path_factory, 2)
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    playbook(c, "weights")
    playbook(c, "deploy")
    yield c
    sim("down", timeout=300)


def test_a_healthy_2node_service_passes_every_check(cluster):
    out = playbook(cluster, "validate").stdout
    for check in ("health", "models", "chat", "reasoning", "tool_call", "image", "long_prompt", "stream"):
        assert "%-12s ok " % check in out, out[-3000:]
    assert "FAIL" not in out


def test_bench_yml_writes_a_report_that_adds_up(cluster, tmp_path):
    playbook(cluster, "bench", "-e", json.dumps({"npuops_bench_matrix": "sim", "npuops_reports_dir": str(tmp_path)}))
    [report_dir] = glob.glob(str(tmp_path / "bench-*"))
    text = open(os.path.join(report_dir, "report.md")).read()
    assert "2node_pp" in text and "## Reconciliation: adds up" in text
    for name in ("throughput_vs_concurrency.png", "per_user_vs_total.png", "latency_percentiles.png"):
        with open(os.path.join(report_dir, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
    points = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(report_dir, "raw", "*.json")))]
    assert len(points) == 6  # the sim matrix: 3 random and 3 multi-turn concurrencies
    planned = sum(p["npuops"]["planned"]["requests"] for p in points)
    assert planned > 0 and sum(1 for _line in open(os.path.join(report_dir, "requests.jsonl"))) == planned
    assert all(p["completed"] == p["npuops"]["planned"]["requests"] and p["failed"] == 0 for p in points)


def test_garbage_from_a_2node_service_fails_the_chat_check(cluster):
    assert_validate_catches_missing_hccn_conf(cluster, "node02")
