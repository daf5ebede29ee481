"""The example inventories describe real clusters: they are only used with playbooks that contact no host."""
import json

import pytest

from npuops_sim.testing import BIN, run


@pytest.mark.parametrize("inventory,hosts,endpoint", [
    ("a3-2node", 2, "http://192.168.100.11:8000"),
    ("a3-4node", 4, "http://192.168.100.11:8000"),
    ("a3-8p8d", 16, "http://192.168.100.11:8080"),
])
def test_plan_of_each_example_inventory(tmp_path, inventory, hosts, endpoint):
    out = tmp_path / "plan.json"
    run([BIN + "/ansible-playbook", "-i", "inventories/" + inventory, "playbooks/plan.yml",
         "-e", "plan_output=%s" % out])
    plan = json.loads(out.read_text())
    assert len(plan["hosts"]) == hosts and plan["endpoint"] == endpoint
    leaders = [h for h, e in plan["hosts"].items() if e["role"] == "leader"]
    assert len(leaders) == (2 if inventory == "a3-8p8d" else 1)


def test_a_broken_inventory_fails_once_with_every_problem(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("""
all:
  vars:
    npuops_tier: 4node_dp
    npuops_model: kimi_k3_w4a8
    npuops_model_dir: models/k3
    npuops_image: quay.io/ascend/vllm-ascend:v0.23.0-a3
  children:
    npu_nodes:
      hosts:
        n1: {npuops_node_ip: 10.0.0.1, npuops_nic: eth0}
        n2: {npuops_node_ip: 10.0.0.1, npuops_nic: eth0, npuops_preflight_strict: "false"}
        n3: {npuops_node_ip: 10.0.0.3}
""")
    proc = run([BIN + "/ansible-playbook", "-i", str(inv), "playbooks/plan.yml", "-e", "plan_output=%s" %
                (tmp_path / "plan.json")], check=False)
    assert proc.returncode != 0
    text = proc.stdout
    assert text.count("fatal:") == 1  # once, for the whole inventory
    for expected in ("needs 4 hosts in npu_nodes, the inventory has 3",
                     "npuops_model_dir = 'models/k3' must be an absolute path",
                     "host n2: npuops_node_ip 10.0.0.1 is also the address of n1",
                     "host n2: npuops_preflight_strict = 'false' is a string, not a boolean",
                     "host n3: npuops_nic = None must name the interface"):
        assert expected in text, expected
