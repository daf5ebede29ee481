"""The simulated cluster as Ansible and the operator see it: real SSH, real packets, real containers."""
import re

import pytest

from npuops_sim.testing import BIN, TEST_ENV, run, sim

pytestmark = pytest.mark.sim
HCCN = "/usr/local/Ascend/driver/tools/hccn_tool"


def test_ansible_reaches_every_node_over_ssh(cluster4):
    out = run([BIN + "/ansible", "all", "-i", cluster4.inventory, "-m", "ansible.builtin.ping", "-o"]).stdout
    assert sorted(re.findall(r"^(node\d+) \| SUCCESS", out, re.M)) == ["node01", "node02", "node03", "node04"]


def test_each_node_shows_eight_cards_of_two_chips_with_its_own_values(cluster4):
    powers = {}
    for node in ("node01", "node02", "node03", "node04"):
        table = cluster4.ssh(node, "npu-smi info").stdout
        rows = re.findall(r"^\| (\d+)\s+Ascend910\s+\| (\w+)\s+\| (\S+)", table, re.M)
        assert len(rows) == 16 and sorted({r[0] for r in rows}) == [str(i) for i in range(8)]
        assert all(r[1] == "OK" for r in rows)
        p = cluster4.profile(node)
        powers[node] = [r[2] for r in rows]
        assert powers[node][0] == "%.1f" % p["cards"][0]["chips"][0]["power_w"]
        assert powers[node][1] == "-"
        mapping = cluster4.ssh(node, "npu-smi info -m").stdout.splitlines()[1:]
        logic = [line.split() for line in mapping if "Mcu" not in line]
        assert sorted(int(r[2]) for r in logic) == list(range(16))
        assert sum("Mcu" in line for line in mapping) == 8
        assert cluster4.ssh(node, "hostname").stdout.strip() == node
    assert len({tuple(v) for v in powers.values()}) == 4  # each node prints its own values


def test_device_addresses_are_unique_across_the_cluster(cluster4):
    seen = {}
    for node in ("node01", "node02", "node03", "node04"):
        conf = cluster4.ssh(node, "cat /etc/hccn.conf").stdout
        addrs = re.findall(r"^address_(\d+)=(\S+)$", conf, re.M)
        assert [int(a[0]) for a in addrs] == list(range(16))
        for _, ip in addrs:
            assert ip not in seen, "%s of %s also on %s" % (ip, node, seen.get(ip))
            seen[ip] = node


def test_ping_fails_after_link_down_and_recovers_after_clear(cluster4):
    peer = cluster4.profile("node01")["devices"]["5"]["ip"]
    cmd = "%s -i 3 -ping -g address %s" % (HCCN, peer)
    ok = cluster4.ssh("node02", cmd)
    assert "3 packets transmitted, 3 received, 0.00% packet loss" in ok.stdout
    env = " ".join("%s=%s" % kv for kv in sorted(TEST_ENV.items()))
    run(["bash", "-c", "%s make -s sim-fault NODE=2 FAULT=link_down DEVICE=3" % env])
    down = cluster4.ssh("node02", cmd, check=False)
    assert down.returncode != 0 and "3 received" not in down.stdout and "100.00% packet loss" in down.stdout
    assert cluster4.ssh("node02", "%s -i 3 -link -g" % HCCN).stdout.strip() == "link status: DOWN"
    # the device is unreachable from its peers too: the packets really go nowhere
    mine = cluster4.profile("node02")["devices"]["3"]["ip"]
    assert "100.00% packet loss" in cluster4.ssh("node01", "%s -i 0 -ping -g address %s" % (HCCN, mine),
                                                 check=False).stdout
    run(["bash", "-c", "%s make -s sim-fault NODE=2 FAULT=clear" % env])
    assert "3 received" in cluster4.ssh("node02", cmd).stdout
    assert cluster4.ssh("node02", "%s -i 3 -link -g" % HCCN).stdout.strip() == "link status: UP"


def test_two_nodes_run_a_container_named_vllm_at_the_same_time(cluster4):
    image = "localhost/npuops-sim/vllm-ascend:v0.23.0-a3"
    start = ("podman run -d --name vllm --network host --device /dev/davinci0 %s "
             "sh -c 'trap \"exit 0\" TERM; while :; do sleep 1; done'" % image)
    try:
        for node in ("node01", "node02"):
            cluster4.ssh(node, start)
        for node in ("node01", "node02"):
            state = cluster4.ssh(node, "podman inspect vllm --format '{{.State.Running}} {{.HostConfig.NetworkMode}}'")
            assert state.stdout.split() == ["true", "host"]
            dev = cluster4.ssh(node, "podman exec vllm sh -c 'test -c /dev/davinci0 && hostname'")
            assert dev.stdout.strip() == node  # host network: the container sees the node's UTS/network
        assert cluster4.ssh("node03", "podman ps -a --format '{{.Names}}'").stdout.strip() == ""
    finally:
        for node in ("node01", "node02"):
            cluster4.ssh(node, "podman rm -f -t 2 vllm", check=False)


@pytest.mark.parametrize("fault,device,probe,expect", [
    ("chip_alarm", 9, "npu-smi info -t health -i 4 -c 1", "Health Status                  : Alarm"),
    ("chip_warning", 2, "npu-smi info", "| 1     Ascend910           | Warning"),
    ("hbm_busy", 0, "npu-smi info", "58959/ 65536"),
    ("tls_mismatch", 4, HCCN + " -i 4 -tls -g", "tls switch[1]"),
    ("net_health_init", 6, HCCN + " -i 6 -net_health -g", "net health status: Init"),
    ("old_driver", None, "cat /usr/local/Ascend/driver/version.info", "Version=24.1.rc3.7"),
    ("no_shm", None, "df -m --output=size /dev/shm | tail -1", "64"),
    ("hccn_conf_missing", None, "test -e /etc/hccn.conf || echo gone", "gone"),
])
def test_each_fault_shows_where_the_real_one_would_and_clear_undoes_it(cluster4, fault, device, probe, expect):
    before = cluster4.ssh("node03", probe, check=False).stdout
    assert expect not in before
    args = ["fault", "--node", "3", "--fault", fault] + (["--device", str(device)] if device is not None else [])
    sim(*args)
    assert expect in cluster4.ssh("node03", probe, check=False).stdout
    sim("fault", "--node", "3", "--fault", "clear")
    assert cluster4.ssh("node03", probe, check=False).stdout == before


def test_port_busy_holds_the_port_until_cleared(cluster4):
    probe = "python3 -c 'import socket; s=socket.socket(); s.bind((\"0.0.0.0\", 8000)); print(\"free\")'"
    assert cluster4.ssh("node04", probe).stdout.strip() == "free"
    sim("fault", "--node", "4", "--fault", "port_busy", "--port", "8000")
    assert "Address already in use" in cluster4.ssh("node04", probe, check=False).stderr
    sim("fault", "--node", "4", "--fault", "clear")
    assert cluster4.ssh("node04", probe).stdout.strip() == "free"


def test_fabric_cut_between_two_nodes_breaks_only_that_pair(cluster4):
    to3 = cluster4.profile("node03")["devices"]["0"]["ip"]
    to2 = cluster4.profile("node02")["devices"]["0"]["ip"]
    sim("fault", "--node", "1", "--fault", "fabric_cut", "--peer", "3")
    try:
        assert "100.00% packet loss" in cluster4.ssh("node01", "%s -i 7 -ping -g address %s" % (HCCN, to3),
                                                     check=False).stdout
        assert "3 received" in cluster4.ssh("node01", "%s -i 7 -ping -g address %s" % (HCCN, to2)).stdout
        faults = {n: cluster4.profile(n)["faults"] for n in ("node01", "node03")}
        assert faults == {"node01": [{"fault": "fabric_cut", "peer": "node03"}],
                          "node03": [{"fault": "fabric_cut", "peer": "node01"}]}
    finally:
        sim("fault", "--node", "1", "--fault", "clear")
    assert "3 received" in cluster4.ssh("node01", "%s -i 7 -ping -g address %s" % (HCCN, to3)).stdout
    assert cluster4.profile("node03")["faults"] == []


def test_status_lists_the_nodes(cluster4):
    out = sim("status").stdout
    assert out.startswith("cluster %s: 4 A3 nodes (+0 gateways), image " % TEST_ENV["SIM_ID"]), out
    assert out.count(" up faults=") == 4


def test_unknown_fault_and_node_are_refused_with_the_reason(cluster4):
    bad = sim("fault", "--node", "9", "--fault", "link_down", "--device", "1", check=False)
    assert bad.returncode != 0 and "no node" in bad.stderr
    bad = sim("fault", "--node", "2", "--fault", "link_down", check=False)
    assert bad.returncode != 0 and "DEVICE" in bad.stderr
    bad = sim("fault", "--node", "2", "--fault", "melted", check=False)
    assert bad.returncode != 0 and "unknown fault" in bad.stderr


def test_npu_table_playbook_prints_every_node(cluster4):
    out = run([BIN + "/ansible-playbook", "-i", cluster4.inventory, "playbooks/npu_table.yml"]).stdout
    assert out.count("| npu-smi 25.5.1") == 4
    assert re.search(r"node04\s+: ok=2\s+changed=0\s+unreachable=0\s+failed=0", out)



def proc_state(pid):
    """The kernel state letter of a process (R, S, T for stopped, ...), read on this machine by PID."""
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_npu_smi_hang_blocks_npu_smi_until_cleared(cluster4):
    sim("fault", "--node", "2", "--fault", "npu_smi_hang")
    try:
        hung = cluster4.ssh("node02", "timeout 3 npu-smi info -m; echo rc=$?", check=False)
        assert "rc=124" in hung.stdout  # killed by timeout: it never answered
    finally:
        sim("fault", "--node", "2", "--fault", "clear")
    assert "Chip Logic ID" in cluster4.ssh("node02", "timeout 3 npu-smi info -m").stdout


def test_node_down_cuts_the_node_off_until_cleared(cluster4):
    device = cluster4.profile("node04")["devices"]["0"]["ip"]
    ssh = ["ssh", "-i", cluster4.api.ssh_dir() + "/id_ed25519", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
           "-o", "UserKnownHostsFile=%s/known_hosts" % cluster4.api.ssh_dir(), "root@" + cluster4.ip("node04"),
           "hostname"]
    sim("fault", "--node", "4", "--fault", "node_down")
    try:
        assert run(["ping", "-c", "1", "-W", "1", cluster4.ip("node04")], check=False).returncode != 0
        assert run(ssh, check=False, timeout=30).returncode == 255  # ssh: connection timed out
        assert "100.00% packet loss" in cluster4.ssh("node03", "%s -i 0 -ping -g address %s" % (HCCN, device),
                                                     check=False).stdout
    finally:
        sim("fault", "--node", "4", "--fault", "clear")
    assert run(ssh, timeout=30).stdout.strip() == "node04"
    assert "0.00% packet loss" in cluster4.ssh("node03", "%s -i 0 -ping -g address %s" % (HCCN, device)).stdout


def test_engine_hang_and_relay_hang_freeze_the_processes_until_cleared(cluster4):
    image = "localhost/npuops-sim/vllm-ascend:v0.23.0-a3"
    cluster4.ssh("node01", "podman run -d --name vllm --network host %s sh -c 'sleep 600 & wait'" % image)
    engine = int(cluster4.ssh("node01", "podman inspect --format '{{.State.Pid}}' vllm").stdout)
    relay = int(cluster4.ssh("node01", "echo 'import time; time.sleep(600)' > /tmp/npuops_weight_server.py && "
                                       "{ setsid python3 /tmp/npuops_weight_server.py serve >/dev/null 2>&1 & "
                                       "echo $!; }").stdout)
    try:
        assert proc_state(engine) in "SR" and proc_state(relay) in "SR"
        sim("fault", "--node", "1", "--fault", "engine_hang")
        assert proc_state(engine) == "T" and proc_state(relay) in "SR"
        sim("fault", "--node", "1", "--fault", "relay_hang")
        assert proc_state(relay) == "T"
        assert {f["fault"] for f in cluster4.profile("node01")["faults"]} == {"engine_hang", "relay_hang"}
        sim("fault", "--node", "1", "--fault", "clear")
        assert proc_state(engine) in "SR" and proc_state(relay) in "SR"
    finally:
        cluster4.ssh("node01", "podman rm -f -t 1 vllm; kill %d; rm -f /tmp/npuops_weight_server.py" % relay,
                     check=False)


def test_engine_hang_without_an_engine_is_refused(cluster4):
    bad = sim("fault", "--node", "3", "--fault", "engine_hang", check=False)
    assert bad.returncode != 0 and "found no container vllm" in bad.stderr
