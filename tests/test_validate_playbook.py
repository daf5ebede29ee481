"""playbooks/validate.yml and bench.yml on the 2-node TP16xPP2 simulated cluster: a healthy service passes
every check and benchmarks into a report that adds up; one node without /etc/hccn.conf makes it answer
garbage and the chat check fails."""
import glob
import hashlib
import json
import os
import threading

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
    # the inventory now says max_num_seqs 32 where the engines run the recipe's 64 (a rollout since, or one to come):
    # the report names what ran, and how it differs from the plan
    playbook(cluster, "bench", "-e", json.dumps({"npuops_bench_matrix": "sim", "npuops_reports_dir": str(tmp_path),
                                                 "npuops_vllm_overrides": {"max_num_seqs": 32}}))
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
    # without preflight in the run, the report still records what the engines run: read from the running image
    meta = json.load(open(os.path.join(report_dir, "meta.json")))
    assert meta["recipe"] == "gpuworks_kimi_k3_1_pro_2node_a3" and sorted(meta["images"]) == ["node01", "node02"]
    assert " --max-num-seqs 64 " in meta["run"]["flags"] + " " and " --max-num-seqs 32 " not in meta["run"]["flags"]
    assert meta["run"]["differs_from_plan"] == "--max-num-seqs 64 (the plan: 32)", meta["run"]
    assert "- differs from plan: --max-num-seqs 64 (the plan: 32)" in text
    for host, held in meta["images"].items():
        running = cluster.ssh(host, "podman inspect --format '{{.Image}}' vllm").stdout.strip()
        assert running and running in held["id"] and held["image"].endswith(":kimi-k3.1-pro-a3"), (host, held)
        assert held["versions"]["vllm"] == "0.23.0" and held["versions"]["cann"] == "9.1.0", (host, held)


def test_garbage_from_a_2node_service_fails_the_chat_check(cluster):
    assert_validate_catches_missing_hccn_conf(cluster, "node02")


def test_an_http_200_without_finite_log_probabilities_fails_the_chat_check(cluster):
    """The engine answers 200 with the right text, but its token log-probabilities are not finite (a non-finite
    tensor: fault nonfinite): "An HTTP 200 response alone is not a sufficient pass condition" (the vLLM-Ascend Kimi-K3
    guide); validate fails naming the check."""
    sim("fault", "--node", "1", "--fault", "nonfinite")
    try:
        proc = playbook(cluster, "validate", check=False)
    finally:
        sim("fault", "--node", "1", "--fault", "clear")
    flat = " ".join(proc.stdout.split())
    assert proc.returncode != 0 and "chat FAIL" in flat, flat[-3000:]
    assert "HTTP 200, but " in flat and "token log-probabilities are not finite" in flat, flat[-3000:]


DRAFT_DIR = "/srv/models/kimi-k3-dspark"
DRAFT = {"npuops_draft": "inferact_kimi_k3_dspark", "npuops_draft_dir": DRAFT_DIR}
# a decode-bound point at two concurrencies: what a draft changes (the tutorial's section 9.2 compares a baseline and
# a matching DSpark draft on the same workload)
SPEC_MATRIX = {"npuops_bench_matrix": "spec", "npuops_bench_matrices": {"spec": [
    {"series": "random-128x96", "kind": "random", "input_len": 128, "output_len": 96, "ignore_eos": True,
     "prompts_per_concurrency": 4, "min_prompts": 4, "concurrency": [1, 4]}]}}


def draft_digests(c, node):
    root = c.api.root_of(node) + DRAFT_DIR
    return dict((name, hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest())
                for name in sorted(os.listdir(root)) if name.endswith((".safetensors", ".json")))


def test_a_dspark_draft_is_copied_served_measured_and_compared_with_the_run_without_it(cluster, tmp_path):
    """The draft only on node01: weights.yml copies and verifies it to node02 like the model; deploy.yml restarts both
    engines with the tutorial's --speculative-config (node 0 and the worker); the bench report shows the draft's
    acceptance from vLLM's spec_decode metrics and compares each point with the same matrix run without the draft.
    The secret test after it deploys again without the draft."""
    base_dir, draft_dir = tmp_path / "base", tmp_path / "draft"
    playbook(cluster, "bench", "-e", json.dumps(dict(SPEC_MATRIX, npuops_reports_dir=str(base_dir))))
    [baseline] = glob.glob(str(base_dir / "bench-*"))

    sim("weights", "--node", "1", "--size", "4M", "--files", "1", "--dir", DRAFT_DIR)
    out = playbook(cluster, "weights", "-e", json.dumps(DRAFT)).stdout
    assert "%s -> node01, node02" % DRAFT_DIR in out, out[-3000:]
    assert draft_digests(cluster, "node02") == draft_digests(cluster, "node01") != {}

    playbook(cluster, "deploy", "-e", json.dumps(DRAFT), "-e", '{"npuops_rollout_allow_downtime": true}')
    for node in ("node01", "node02"):
        argv = json.loads(cluster.ssh(node, "podman inspect --format '{{json .Config.Cmd}}' vllm").stdout)
        config = json.loads(argv[argv.index("--speculative-config") + 1])
        assert config == {"method": "dspark", "model": DRAFT_DIR, "num_speculative_tokens": 7,
                          "draft_tensor_parallel_size": 16, "max_model_len": 4096, "draft_sample_method": "greedy",
                          "enforce_eager": True}, node

    playbook(cluster, "bench", "-e", json.dumps(dict(SPEC_MATRIX, **DRAFT, npuops_reports_dir=str(draft_dir),
                                                     npuops_bench_compare_with=baseline)))
    [report_dir] = glob.glob(str(draft_dir / "bench-*"))
    summary = json.load(open(os.path.join(report_dir, "summary.json")))
    for row in summary["table"]:
        assert 0 < row["draft_acceptance_rate"] <= 1 and 1 < row["mean_acceptance_length"] <= 8, row
    report = open(os.path.join(report_dir, "report.md")).read()
    assert "instance main drafts with `inferact_kimi_k3_dspark`, 7 speculative tokens" in report
    assert "| draft acceptance | mean acceptance length |" in report
    comparison = open(os.path.join(report_dir, "comparison.md")).read()
    assert "this run: draft inferact_kimi_k3_dspark (k=7)" in comparison and "baseline: draft none" in comparison
    rows = [line for line in comparison.splitlines() if line.startswith("| random-128x96")]
    assert len(rows) == 2, comparison
    # each verify step yields several tokens: the time per output token drops against the same point without it
    raw = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(report_dir, "raw", "*.json")))]
    base = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(baseline, "raw", "*.json")))]
    for with_draft, without in zip(raw, base):
        assert with_draft["median_tpot_ms"] < 0.9 * without["median_tpot_ms"], (with_draft["median_tpot_ms"],
                                                                                without["median_tpot_ms"])


class PsSampler(threading.Thread):
    """`ps -eo args` on every node, every half second while a playbook runs (what any user of a node can see)."""

    def __init__(self, c, nodes):
        threading.Thread.__init__(self, daemon=True)
        self.c, self.nodes, self.seen, self.done = c, nodes, [], threading.Event()

    def run(self):
        while not self.done.is_set():
            for node in self.nodes:
                self.seen.append(self.c.ssh(node, "ps -eo args", check=False, timeout=30).stdout)
            self.done.wait(0.5)


def test_no_secret_reaches_any_output_argv_label_report_or_file(cluster, tmp_path):
    """The API key, the preflight reach token and the weight token, set to known values, are searched for in the
    play's output (at -vvv, which prints every module's arguments and result: more than any lower verbosity), in
    `ps` on every node while it runs, in the containers' inspect, in the reports and in the model directories. The
    search is shown to work: the extra-vars file it was given holds them all."""
    verbosity = "-vvv"
    secrets = {"npuops_serve_api_key": "sk-npuops-%s-apikey-5e1f" % verbosity[1:],
               "npuops_preflight_token": "pft%sE4d1c9Q" % len(verbosity),
               "npuops_weights_token": "wtk%sA7b3f2Z" % len(verbosity)}
    extra = tmp_path / "secrets.json"
    extra.write_text(json.dumps(dict(secrets, npuops_reports_dir=str(tmp_path / "reports"),
                                     npuops_rollout_allow_downtime=True)))
    assert all(v in extra.read_text() for v in secrets.values())  # the search sees what is there
    cluster.ssh("node02", "rm -f /srv/models/kimi-k3-w4a8/model-00002-of-00002.safetensors")  # a copy must happen
    sampler = PsSampler(cluster, ["node01", "node02"])
    sampler.start()
    try:
        out = playbook(cluster, "site", verbosity, "--skip-tags", "bench,monitor", "-e", "@%s" % extra,
                       timeout=900).stdout
    finally:
        sampler.done.set()
        sampler.join(60)
    assert sampler.seen and any("vllm" in s for s in sampler.seen)  # it sampled while the engines ran
    assert "Pull from the nodes before this one" in out or "copy" in out.lower()
    places = {"output": out, "ps": "\n".join(sampler.seen)}
    for node in ("node01", "node02"):
        places["inspect %s" % node] = cluster.ssh(node, "podman inspect vllm", check=False).stdout
        # the model directories, the run directory, Ansible's async job results and /tmp (the copy is async)
        places["files %s" % node] = cluster.ssh(
            node, "grep -r -l -a -e %s /srv/models /run/npuops /root/.ansible_async /tmp 2>/dev/null; true"
            % " -e ".join(secrets.values()), check=False).stdout
    reports = []
    for path in glob.glob(str(tmp_path / "reports" / "**" / "*"), recursive=True):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                reports.append(f.read().decode("utf-8", "replace"))
    places["reports"] = "\n".join(reports)
    assert reports, "the run wrote no report to search"
    leaks = [(name, where) for name, value in secrets.items() for where, text in places.items() if value in text]
    assert leaks == []

