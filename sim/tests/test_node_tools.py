"""The fake npu-smi/hccn_tool print the real formats (published dumps, e.g. vllm-ascend#2035):
rows rendered from a profile with the values of a published A3 dump must equal that dump's lines."""
import json
import os
import subprocess
import sys

import pytest

from npuops_sim import plan, profile
from npuops_sim.node_tools import npu_smi as npu_smi_tool

TOOLS = os.path.join(os.path.dirname(__file__), "..", "npuops_sim", "node_tools")

# verbatim lines of an A3 `npu-smi info` (vllm-ascend#2035, npu-smi 24.1.rc3.7)
A3_LINES = [
    "| npu-smi 24.1.rc3.7               Version: 24.1.rc3.7                                           |",
    "+---------------------------+---------------+----------------------------------------------------+",
    "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
    "| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
    "+===========================+===============+====================================================+",
    "| 0     Ascend910           | OK            | 178.8       36                0    / 0             |",
    "| 0     0                   | 0000:9D:00.0  | 0           0    / 0          3397 / 65536         |",
    "+------------------------------------------------------------------------------------------------+",
    "| 0     Ascend910           | OK            | -           36                0    / 0             |",
    "| 1     1                   | 0000:9F:00.0  | 0           0    / 0          3186 / 65536         |",
    "| 1     Ascend910           | OK            | 185.4       36                0    / 0             |",
    "| 0     2                   | 0000:99:00.0  | 0           0    / 0          3415 / 65536         |",
    "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |",
    "| No running processes found in NPU 0                                                            |",
]


@pytest.fixture
def a3_profile(tmp_path):
    p = profile.build(plan.nodes(1, "a3")[0], "a3", plan.AddressPlan())
    p["npu_smi_version"] = "24.1.rc3.7"
    values = [(178.8, "9D", 3397), (None, "9F", 3186), (185.4, "99", 3415)]
    chips = [ch for c in p["cards"] for ch in c["chips"]]
    for chip, (power, bus, hbm) in zip(chips, values):
        chip.update(power_w=power, temp_c=36, bus_id="0000:%s:00.0" % bus, hbm_used_mb=hbm)
    return p


def run_tool(tmp_path, p, tool, *args):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(p))
    hccn = tmp_path / "hccn"
    for rel, text in profile.render_hccn(p).items():
        (hccn / rel).parent.mkdir(parents=True, exist_ok=True)
        (hccn / rel).write_text(text)
    smi = tmp_path / "npu_smi"
    for rel, text in npu_smi_tool.render_all(p).items():
        (smi / rel).parent.mkdir(parents=True, exist_ok=True)
        (smi / rel).write_text(text)
    env = dict(os.environ, NPUOPS_SIM_PROFILE=str(path), NPUOPS_SIM_DEVMGR=str(path), NPUOPS_SIM_HCCN=str(hccn),
               NPUOPS_SIM_NPU_SMI=str(smi))
    interpreter = ["/bin/sh"] if tool.endswith(".sh") else [sys.executable]
    return subprocess.run(interpreter + [os.path.join(TOOLS, tool)] + list(args), env=env, text=True,
                          capture_output=True, check=False)


def test_npu_smi_info_renders_the_published_a3_rows_exactly(tmp_path, a3_profile):
    out = run_tool(tmp_path, a3_profile, "npu_smi.py", "info").stdout.splitlines()
    for line in A3_LINES:
        assert line in out
    assert len([line for line in out if "Ascend910" in line]) == 16


def test_five_digit_hbm_use_loses_its_space_as_the_real_tool_does(tmp_path, a3_profile):
    p = profile.apply_fault(a3_profile, "hbm_busy", device=4)
    out = run_tool(tmp_path, p, "npu_smi.py", "info").stdout
    assert "58959/ 65536" in out
    assert "| 2       0                 | 2268921       | python3                  | 55600                   |" in out


def test_npu_smi_m_maps_cards_and_chips_to_logic_and_physical_ids(tmp_path, a3_profile):
    lines = run_tool(tmp_path, a3_profile, "npu_smi.py", "info", "-m").stdout.splitlines()
    assert lines[0].split() == ["NPU", "ID", "Chip", "ID", "Chip", "Logic", "ID", "Chip", "Phy-ID", "Chip", "Name"]
    rows = [line.split() for line in lines[1:]]
    assert ["0", "0", "0", "0", "Ascend910"] in rows and ["7", "1", "15", "15", "Ascend910"] in rows
    assert ["3", "2", "-", "-", "Mcu"] in rows
    assert len(rows) == 24


@pytest.mark.parametrize("args", [["info"], ["info", "-m"], ["info", "-l"], ["info", "-t", "board", "-i", "3"],
                                  ["info", "-t", "board", "-i", "3", "-c", "1"], ["info", "-t", "health", "-i", "0"],
                                  ["info", "-t", "usages", "-i", "7", "-c", "0"], ["info", "-t", "spod-info", "-i", "2",
                                                                                   "-c", "1"],
                                  ["info", "-t", "health", "-i", "9"], ["info", "-t", "health", "-i", "1", "-c", "5"],
                                  ["info", "-t", "flash", "-i", "1"]])
def test_the_sh_front_end_prints_what_the_renderer_answers(tmp_path, a3_profile, args):
    p = profile.apply_fault(a3_profile, "hbm_busy", device=6)
    direct = run_tool(tmp_path, p, "npu_smi.py", *args)
    fast = run_tool(tmp_path, p, "npu_smi.sh", *args)
    assert (fast.stdout, fast.returncode == 0) == (direct.stdout, direct.returncode == 0)


def test_npu_smi_without_the_driver_fails_like_dcmi(tmp_path, a3_profile):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(a3_profile))
    env = dict(os.environ, NPUOPS_SIM_PROFILE=str(path), NPUOPS_SIM_DEVMGR=str(tmp_path / "absent"))
    proc = subprocess.run([sys.executable, os.path.join(TOOLS, "npu_smi.py"), "info"], env=env, text=True,
                          capture_output=True, check=False)
    assert proc.returncode != 0 and "dcmi module initialize failed. ret is -8005" in proc.stdout


def test_health_and_board_queries(tmp_path, a3_profile):
    p = profile.apply_fault(a3_profile, "chip_alarm", device=9)
    health = run_tool(tmp_path, p, "npu_smi.py", "info", "-t", "health", "-i", "4", "-c", "1").stdout
    assert "Health Status                  : Alarm" in health
    board = run_tool(tmp_path, p, "npu_smi.py", "info", "-t", "board", "-i", "0", "-c", "0").stdout
    assert "NPU Name                       : 9392" in board and "Chip Name                      : Ascend910" in board
    bad = run_tool(tmp_path, p, "npu_smi.py", "info", "-t", "health", "-i", "8")
    assert bad.returncode != 0


def test_hccn_tool_get_items_print_the_real_formats(tmp_path, a3_profile):
    dev = a3_profile["devices"]["3"]
    assert run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "3", "-link", "-g").stdout == "link status: UP\n"
    assert run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "3", "-net_health", "-g").stdout == \
        "net health status: Success\n"
    assert run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "3", "-ip", "-g").stdout == \
        "ipaddr:%s\nnetmask:255.255.240.0\n" % dev["ip"]
    tls = run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "3", "-tls", "-g").stdout
    assert tls.startswith("dev_id:3, tls switch[0](0:disable, 1:enable), tls preconfigured[1]")
    vnic = run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "3", "-vnic", "-g").stdout.splitlines()
    assert vnic == ["vnic link status: UP", "vnic ipaddr: %s" % dev["vnic_ip"], "vnic netmask: 255.255.255.0"]
    hccs = run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "3", "-hccs_ping", "-g", "address", "10.0.0.1")
    assert hccs.stdout.strip() == "This device does not support this function." and hccs.returncode != 0
    assert run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "16", "-link", "-g").returncode != 0
    gw = run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "3", "-gateway", "-g").stdout
    assert gw == "default gateway:%s, Iface:eth3\n" % dev["gateway"]
    lldp = run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "3", "-lldp", "-g").stdout
    assert "\tIfname: %s\n" % dev["lldp_port"] in lldp


def test_hccn_tool_ping_reports_loss_in_the_real_summary_format(tmp_path, a3_profile):
    """Real packets over loopback: 127.0.0.1 answers, an address nobody has does not."""
    a3_profile["devices"]["2"]["ip"] = "127.0.0.1"
    ok = run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "2", "-ping", "-g", "address", "127.0.0.1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0] == "device 2 PING 127.0.0.1" and lines[-1] == "3 packets transmitted, 3 received, 0.00% packet loss"
    assert all(line.startswith("recv seq=") and line.endswith("ms") for line in lines[1:-1])
    # a source address this machine does not have: nothing can be sent, as when the device's link is down
    a3_profile["devices"]["2"]["ip"] = "192.0.2.253"
    lost = run_tool(tmp_path, a3_profile, "hccn_tool.sh", "-i", "2", "-ping", "-g", "address", "127.0.0.1")
    assert lost.returncode != 0
    assert lost.stdout.splitlines()[-1] == "3 packets transmitted, 0 received, 100.00% packet loss"


def fake_proc(root, pid, netns, argv, env, comm="python3"):
    d = root / str(pid)
    (d / "ns").mkdir(parents=True)
    os.symlink(netns, str(d / "ns" / "net"))
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "environ").write_bytes(b"\0".join(("%s=%s" % kv).encode() for kv in env.items()) + b"\0")
    (d / "comm").write_text(comm + "\n")


def test_the_table_lists_the_engines_running_in_this_node_and_their_hbm(tmp_path, a3_profile):
    root = tmp_path / "proc"
    (root / "self" / "ns").mkdir(parents=True)
    os.symlink("net:[4026531]", str(root / "self" / "ns" / "net"))
    engine = ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "/m", "--gpu-memory-utilization", "0.85"]
    fake_proc(root, 4475, "net:[4026531]", engine, {"ASCEND_RT_VISIBLE_DEVICES": "0,1"})
    fake_proc(root, 5000, "net:[4026999]", engine, {"ASCEND_RT_VISIBLE_DEVICES": "0"})  # another node's engine
    fake_proc(root, 5001, "net:[4026531]", ["sleep", "60"], {"ASCEND_RT_VISIBLE_DEVICES": "0"})  # not vLLM
    live = npu_smi_tool.live_processes(a3_profile, proc_root=str(root))
    assert [(q["pid"], q["npu_id"], q["chip_id"]) for q in live] == [(4475, 0, 0), (4475, 0, 1)]
    assert live[0]["memory_mb"] == int(0.85 * 65536) - 3397
    table = npu_smi_tool.info_table(npu_smi_tool.with_live_processes(a3_profile, proc_root=str(root)))
    assert "| 0       0                 | 4475          | python3" in table
    assert "%d/ 65536" % int(0.85 * 65536) in table  # five digits lose their space, as the real tool prints
    assert "No running processes found in NPU 0" not in table and "No running processes found in NPU 1" in table
