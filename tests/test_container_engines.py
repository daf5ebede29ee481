"""The same deployment through docker, podman and isula (the simulated nodes' CLI doubles record every call and
answer like the real CLIs where they differ): each engine's commands are equivalent, the service comes up through
each, the benchmark authenticates through podman and docker, and the API key reaches no command line."""
import glob
import json
import os

import pytest

from npuops_sim.testing import bring_up, playbook, sim

pytestmark = pytest.mark.sim
ENGINES = ("podman", "docker", "isula")
SECRET = "sk-npuops-engines-0123456789"


# one random point (vllm bench serve inside the engine container) and one multi-turn point (the module's driver)
MATRIX = {"npuops_bench_matrix": "tiny", "npuops_bench_matrices": {"tiny": [
    {"series": "random-64x8", "kind": "random", "input_len": 64, "output_len": 8, "ignore_eos": True,
     "prompts_per_concurrency": 2, "min_prompts": 2, "concurrency": [2]},
    {"series": "agentic-1k", "kind": "multi_turn", "turns": 2, "output_len": 8, "context_tokens": 1000,
     "concurrency": [1]}]}}
BENCHED = ("podman", "docker")


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    c = bring_up(tmp_path_factory, 2)
    sim("weights", "--node", "1", "--size", "64M", "--files", "2")
    playbook(c, "weights")
    runs = {}
    for engine in ENGINES:
        for node in ("node01", "node02"):
            c.ssh(node, "rm -f /run/npuops-sim/*.calls")
        extra = json.dumps({"npuops_container_engine": engine, "npuops_serve_api_key": SECRET})
        out = playbook(c, "deploy", "-e", extra).stdout
        calls = dict((node, [json.loads(line) for line in c.ssh(node, "cat /run/npuops-sim/%s.calls" % engine)
                             .stdout.splitlines()]) for node in ("node01", "node02"))
        inspect = json.loads(c.ssh("node01", "podman inspect vllm").stdout)[0]
        runs[engine] = {"out": out, "calls": calls, "inspect": inspect}
        if engine in BENCHED:
            reports = str(tmp_path_factory.mktemp("reports-" + engine))
            bench = playbook(c, "bench", "-e", json.dumps(dict(
                MATRIX, npuops_container_engine=engine, npuops_serve_api_key=SECRET, npuops_reports_dir=reports)),
                check=False)
            runs[engine].update(bench=bench, reports=reports, bench_calls=dict(
                (node, c.ssh(node, "cat /run/npuops-sim/%s.calls" % engine).stdout) for node in ("node01", "node02")))
        if engine == "podman":
            runs[engine]["wrong_key"] = playbook(c, "bench", "-e", json.dumps(dict(
                MATRIX, npuops_container_engine=engine, npuops_serve_api_key="sk-not-the-engines-key",
                npuops_reports_dir=str(tmp_path_factory.mktemp("reports-wrong")))), check=False)
        playbook(c, "stop", "-e", json.dumps({"npuops_container_engine": engine, "npuops_stop_remove": True}))
    yield c, runs
    sim("down", timeout=300)


def run_argv(calls):
    [run] = [argv for argv in calls if argv[:1] == ["run"]]
    return run


def without_secret_passing(argv):
    """The run argv without how the secret travels (podman's secret store and its wrapper, or an env file)."""
    if "npuops-secrets" in argv:
        i = argv.index("npuops-secrets")
        argv = argv[:i - 3] + argv[i + 1:]  # the `/bin/sh -c <export script> npuops-secrets` prefix
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--secret", "--env-file"):
            skip = True
            continue
        out.append(a)
    return out


def test_the_service_comes_up_through_every_engine(deployed):
    _c, runs = deployed
    for engine in ENGINES:
        assert "2node_pp is serving kimi-k3" in runs[engine]["out"], (engine, runs[engine]["out"][-2000:])


def test_every_engine_is_given_the_same_container(deployed):
    _c, runs = deployed
    for node in ("node01", "node02"):
        argvs = dict((e, without_secret_passing(run_argv(runs[e]["calls"][node]))) for e in ENGINES)
        assert argvs["docker"] == argvs["podman"] == argvs["isula"], node
        assert "--headless" in argvs["podman"] or node == "node01"


def test_each_engine_gets_the_secret_its_own_way_and_never_in_an_argv(deployed):
    _c, runs = deployed
    podman = run_argv(runs["podman"]["calls"]["node01"])
    assert podman[podman.index("--secret") + 1] == "npuops-vllm-vllm-api-key,type=mount,target=VLLM_API_KEY"
    for engine in ("docker", "isula"):
        argv = run_argv(runs[engine]["calls"]["node01"])
        assert argv[argv.index("--env-file") + 1] == "/run/npuops/vllm.env" and "--secret" not in argv
    for engine in ENGINES:
        for node, calls in runs[engine]["calls"].items():
            assert SECRET not in json.dumps(calls), (engine, node)
        assert SECRET not in json.dumps(runs[engine]["inspect"]["Config"]["Labels"])
    # podman's store keeps the value out of inspect; docker and isula cannot (docs/serve.md says so)
    assert SECRET not in json.dumps(runs["podman"]["inspect"])
    assert "VLLM_API_KEY=%s" % SECRET in runs["docker"]["inspect"]["Config"]["Env"]


def test_isula_is_inspected_without_the_type_flag_and_docker_with_it(deployed):
    _c, runs = deployed
    isula = [a for a in runs["isula"]["calls"]["node01"] if a[:1] == ["inspect"]]
    docker = [a for a in runs["docker"]["calls"]["node01"] if a[:1] == ["inspect"]]
    assert isula and all("--type" not in a for a in isula)
    assert docker and all(a[1:3] == ["--type", "container"] for a in docker)


def test_the_bench_authenticates_through_podman_and_docker_and_its_report_adds_up(deployed):
    """The engine's key is a mounted secret (podman) or an env file (docker): `exec` must not depend on either.
    Every request of both points succeeds, and the key is on no command line the CLI double recorded."""
    _c, runs = deployed
    for engine in BENCHED:
        bench = runs[engine]["bench"]
        assert bench.returncode == 0, (engine, bench.stdout[-3000:])
        [report] = glob.glob(os.path.join(runs[engine]["reports"], "bench-*", "report.md"))
        assert "## Reconciliation: adds up" in open(report).read(), engine
        points = [json.load(open(p)) for p in glob.glob(os.path.join(os.path.dirname(report), "raw", "*.json"))]
        assert len(points) == 2 and all(p["completed"] == p["npuops"]["planned"]["requests"] > 0 and
                                        p["failed"] == 0 for p in points), engine
        execs = [json.loads(line) for line in runs[engine]["bench_calls"]["node01"].splitlines()
                 if json.loads(line)[:1] == ["exec"]]
        assert execs and all(a[:2] == ["exec", "-i"] for a in execs), execs
        assert SECRET not in json.dumps(runs[engine]["bench_calls"]) and SECRET not in bench.stdout


def test_a_wrong_key_in_the_bench_path_fails_naming_the_401(deployed):
    _c, runs = deployed
    wrong = runs["podman"]["wrong_key"]
    assert wrong.returncode != 0
    assert "401 Unauthorized" in wrong.stdout and "the API key (npuops_serve_api_key)" in wrong.stdout, \
        wrong.stdout[-3000:]
    assert "sk-not-the-engines-key" not in wrong.stdout
