"""Helpers for tests that bring up simulated nodes (pytest marker `sim`: root, namespaces, sshd, podman).

Test infrastructure. Tests use their own cluster id and address ranges (TEST_ENV), so they never touch a
cluster `make sim-up` made."""
import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.dirname(sys.executable)


def lane_env(environ=None):
    """The cluster id and address ranges of this test process. Each pytest-xdist worker (gw0, gw1, ...) is a lane
    with its own id and ranges, so lanes running side by side never touch each other's cluster, nor a cluster
    `make sim-up` made; NPUOPS_TEST_SIM_ID / _MGMT_NET / _FABRIC_NET override them (a second checkout testing on
    the same machine). SIM_ROOT (read by the simulator itself) gives a checkout its own state and image store."""
    environ = os.environ if environ is None else environ
    worker = environ.get("PYTEST_XDIST_WORKER", "gw0")
    lane = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    if lane > MAX_LANE:
        raise ValueError("test lane %s: at most %d lanes have address ranges of their own" % (worker, MAX_LANE + 1))
    return {"SIM_ID": environ.get("NPUOPS_TEST_SIM_ID", "npst" + (str(lane) if lane else "")),
            "SIM_MGMT_NET": environ.get("NPUOPS_TEST_MGMT_NET", "10.%d.0.0/24" % (223 + 2 * lane)),
            "SIM_FABRIC_NET": environ.get("NPUOPS_TEST_FABRIC_NET", "10.%d.0.0/20" % (224 + 2 * lane))}


# lanes take 10.223-10.242 two by two; molecule's scenarios use 10.243/10.244, the benchmarks 10.245/10.246
MAX_LANE = 9
TEST_ENV = lane_env()


def env():
    e = dict(os.environ, PYTHONPATH=os.path.join(REPO, "sim"), ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
             ANSIBLE_HOST_KEY_CHECKING="True", PATH=BIN + ":" + os.environ.get("PATH", ""))
    e.update(TEST_ENV)
    return e


def run(argv, timeout=600, check=True, **kw):
    if "input" not in kw:
        # a stdin of its own: ssh makes the one it inherits non-blocking, and ansible-playbook refuses to start on that
        kw.setdefault("stdin", subprocess.DEVNULL)
    proc = subprocess.run(argv, env=env(), cwd=REPO, text=True, capture_output=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError("%s failed (rc=%d)\nstdout:\n%s\nstderr:\n%s"
                             % (" ".join(argv), proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:]))
    return proc


def sim(*args, **kw):
    return run([sys.executable, "-m", "npuops_sim"] + list(args), **kw)


class SimCluster:
    """A cluster brought up for one test module; `down()` in the fixture's finalizer."""

    def __init__(self, inventory):
        self.inventory = str(inventory)
        from npuops_sim import cluster, plan
        self.api = cluster.Cluster(TEST_ENV["SIM_ID"], address_plan=plan.AddressPlan(
            TEST_ENV["SIM_MGMT_NET"], TEST_ENV["SIM_FABRIC_NET"]), log=lambda *_: None)

    @property
    def state(self):
        return self.api.load()

    def ip(self, node):
        return self.state["nodes"][node]["mgmt_ip"]

    def ssh(self, node, command, check=True, timeout=120):
        d = self.api.ssh_dir()
        return run(["ssh", "-i", d + "/id_ed25519", "-o", "UserKnownHostsFile=%s/known_hosts" % d,
                    "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "root@" + self.ip(node), command],
                   check=check, timeout=timeout)

    def started(self, nodes, container="vllm"):
        """{node: "<name> <status> <start time>"} of a container (podman inspect; an error text where it is
        missing): a restart changes the start time, so equal answers before and after mean nothing restarted."""
        return dict((n, self.ssh(n, "podman inspect %s --format '{{.Name}} {{.State.Status}} {{.State.StartedAt}}'"
                                 % container, check=False).stdout.strip()) for n in nodes)

    def profile(self, node):
        return json.loads(self.ssh(node, "cat /usr/local/Ascend/driver/lib64/npuops_sim/profile.json").stdout)


def bring_up(tmp_path_factory, nodes, profile="a3", *extra):
    inv = tmp_path_factory.mktemp("inv") / "hosts.yml"
    sim("down", timeout=300)  # a leftover of an interrupted run must not fail this one
    out = sim("up", "--nodes", str(nodes), "--profile", profile, "--inventory", str(inv), *extra, timeout=600)
    c = SimCluster(inv)
    c.up_output = out.stdout
    return c


def playbook(c, name, *extra, check=True, timeout=600):
    return run([BIN + "/ansible-playbook", "-i", c.inventory] + list(extra) + ["playbooks/%s.yml" % name],
               check=check, timeout=timeout)


def plan_of(c, tmp_path):
    """playbooks/plan.yml's report of the cluster's inventory (no host contacted)."""
    out = tmp_path / "plan.json"
    playbook(c, "plan", "-e", "plan_output=%s" % out)
    return json.loads(out.read_text())


def assert_validate_catches_missing_hccn_conf(c, node):
    """With /etc/hccn.conf gone from one node the service starts but answers garbage: validate must fail,
    naming the chat check. The fault is cleared afterwards."""
    sim("fault", "--node", str(int(node[-2:])), "--fault", "hccn_conf_missing")
    try:
        # it restarts the engines; the deploy's own question would stop them (tests/test_diagnose_playbook.py):
        # validate must catch a service that answers garbage by itself
        deployed = playbook(c, "deploy", "-e", '{"npuops_rollout_allow_downtime": true, '
                                               '"npuops_serve_answer_check": false}')
        assert "%s: /etc/hccn.conf missing" % node in deployed.stdout
        proc = playbook(c, "validate", check=False)
        assert proc.returncode != 0, proc.stdout[-3000:]
        assert "Validate:" in proc.stdout and "chat         FAIL" in proc.stdout, proc.stdout[-3000:]
        assert "wrong answer (17*23 is 391" in proc.stdout
    finally:
        sim("fault", "--node", str(int(node[-2:])), "--fault", "clear")
