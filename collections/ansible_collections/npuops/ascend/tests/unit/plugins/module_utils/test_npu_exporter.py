# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import sys
import threading
import time

from ansible_collections.npuops.ascend.plugins.module_utils import npu_exporter, proc
from ansible_collections.npuops.ascend.tests.unit.plugins.module_utils.net_helpers import free_port

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "npu_smi")


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def fake_run(answers, calls=None):
    """A run() that answers from {argv tuple: (rc, out)}; anything else is hccn_tool on a healthy device."""
    def run(argv, timeout):
        if calls is not None:
            calls.append(list(argv))
        key = tuple(argv[1:])
        if key in answers:
            rc, out = answers[key]
            return rc, out, ""
        if argv[0].endswith("hccn_tool"):
            item = argv[3]
            phy = argv[2]
            if item == "-link":
                return 0, "link status: %s\n" % ("DOWN" if phy == "5" else "UP"), ""
            if item == "-net_health":
                return 0, "net health status: %s\n" % ("Receive timeout" if phy == "5" else "Success"), ""
        return 1, "", "unexpected %s" % argv
    return run


def healthy_answers():
    return {("info",): (0, fixture("a3_info.txt")), ("info", "-m"): (0, fixture("a3_info_m.txt"))}


def sample(text, line_start):
    found = [x for x in text.splitlines() if x.startswith(line_start)]
    assert len(found) == 1, (line_start, found)
    return found[0].rsplit(" ", 1)[1]


def test_a3_readings_use_mindcluster_names_and_labels():
    c = npu_exporter.Collector("npu-smi", "/usr/local/Ascend/driver/tools/hccn_tool", run=fake_run(healthy_answers()))
    c.refresh()
    text = c.render()
    assert sample(text, "machine_npu_nums") == "16"
    chip0 = '{id="0",model_name="Ascend910",pcie_bus_info="0000:9D:00.0"}'
    assert sample(text, "npu_chip_info_health_status" + chip0) == "1"
    assert sample(text, "npu_chip_info_hbm_used_memory" + chip0) == "3397"
    assert sample(text, "npu_chip_info_hbm_total_memory" + chip0) == "65536"
    assert sample(text, "npu_chip_info_temperature" + chip0) == "36"
    assert sample(text, "npu_chip_info_power" + chip0) == "178.8"
    assert sample(text, "npu_chip_info_utilization" + chip0) == "0"
    # only chip 0 of a card reports power: chip 1 (physical id 1) has no power sample
    assert 'npu_chip_info_power{id="1",' not in text
    assert sample(text, 'npuops_npu_chip_health{id="0",health="OK"}') == "1"
    # the process row of card 2 chip 0 (physical id 4), with MindCluster's process labels
    assert sample(text, 'npu_chip_info_process_info{id="4",process_id="2268921",container_id="",'
                        'container_name=""}') == "55600"
    assert sample(text, 'npu_chip_info_process_info_num{id="4",') == "1"
    assert sample(text, 'npu_chip_info_link_status{id="5"}') == "0"
    assert sample(text, 'npu_chip_info_link_status{id="15"}') == "1"
    assert sample(text, 'npu_chip_info_network_status{id="5"}') == "0"
    assert sample(text, 'npuops_npu_net_health{id="5",state="Receive timeout"}') == "1"
    assert sample(text, 'npuops_npu_exporter_read_error{source="npu-smi info"}') == "0"
    assert "# TYPE npu_chip_info_health_status gauge" in text


def test_an_alarmed_chip_is_unhealthy_and_its_state_is_named():
    answers = healthy_answers()
    table = fixture("a3_info.txt").splitlines()
    # card 1 chip 1 (physical id 3): the first row of its pair says Alarm
    at = [i for i, x in enumerate(table) if "0000:9B:00.0" in x][0] - 1
    table[at] = table[at].replace("| OK            |", "| Alarm         |")
    answers[("info",)] = (0, "\n".join(table) + "\n")
    c = npu_exporter.Collector("npu-smi", "hccn_tool", run=fake_run(answers))
    c.refresh()
    text = c.render()
    assert sample(text, 'npu_chip_info_health_status{id="3",') == "0"
    assert sample(text, 'npuops_npu_chip_health{id="3",health="Alarm"}') == "1"
    assert sample(text, 'npu_chip_info_health_status{id="2",') == "1"


def test_a_failed_read_reports_minus_one_and_the_error_and_keeps_the_devices():
    answers = healthy_answers()
    c = npu_exporter.Collector("npu-smi", "hccn_tool", run=fake_run(answers))
    c.refresh()
    answers[("info",)] = (proc.TIMED_OUT, "")
    c.refresh()
    text = c.render()
    assert sample(text, 'npu_chip_info_health_status{id="0",') == "-1"
    assert 'npu_chip_info_hbm_used_memory{' not in text  # no stale values presented as current
    assert sample(text, 'npuops_npu_exporter_read_error{source="npu-smi info"}') == "1"
    assert sample(text, 'npu_chip_info_link_status{id="0"}') == "1"


def test_dcmi_failure_is_a_read_error_not_a_crash():
    answers = healthy_answers()
    answers[("info",)] = (1, fixture("dcmi_failure.txt"))
    c = npu_exporter.Collector("npu-smi", "hccn_tool", run=fake_run(answers))
    c.refresh()
    text = c.render()
    assert sample(text, 'npuops_npu_exporter_read_error{source="npu-smi info"}') == "1"
    assert sample(text, "machine_npu_nums") == "0"


def test_the_map_is_read_once_and_gives_the_physical_ids():
    calls = []
    c = npu_exporter.Collector("npu-smi", "hccn_tool", run=fake_run(healthy_answers(), calls))
    c.refresh()
    c.refresh()
    assert sum(1 for a in calls if a == ["npu-smi", "info", "-m"]) == 1
    assert sum(1 for a in calls if a == ["npu-smi", "info"]) == 2
    assert ["hccn_tool", "-i", "15", "-link", "-g"] in calls


def test_label_values_are_escaped():
    f = npu_exporter.Family("x", "help").add([("a", 'q"u\\o\nte')], 1)
    assert f.text().splitlines()[-1] == 'x{a="q\\"u\\\\o\\nte"} 1'


def test_probe_results_are_exported():
    c = npu_exporter.Collector("npu-smi", "hccn_tool", run=fake_run(healthy_answers()),
                               probes=[{"name": "proxy_main", "url": "http://10.0.0.11:8080/healthcheck"}],
                               http_get=lambda url, timeout: False)
    c.refresh()
    assert sample(c.render(), 'npuops_probe_success{probe="proxy_main",url="http://10.0.0.11:8080/healthcheck"}') == "0"


def test_parse_probe_refuses_what_is_not_a_url():
    assert npu_exporter.parse_probe("p=http://a:1/h") == {"name": "p", "url": "http://a:1/h"}
    for bad in ("p", "=http://a", "p=ftp://a"):
        try:
            npu_exporter.parse_probe(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_command_line_is_the_same_for_process_and_unit():
    argv = npu_exporter.command_line("/usr/bin/python3", "/opt/npuops/npu-exporter/", "10.0.0.11", 9911, "npu-smi",
                                     "/usr/local/Ascend/driver/tools/hccn_tool", 5, 10.0,
                                     [{"name": "proxy_main", "url": "http://10.0.0.11:8080/healthcheck"}])
    assert argv == ["/usr/bin/python3", "/opt/npuops/npu-exporter/npuops-npu-exporter", "--address", "10.0.0.11",
                    "--port", "9911", "--npu-smi", "npu-smi", "--hccn-tool", "/usr/local/Ascend/driver/tools/hccn_tool",
                    "--timeout", "5", "--interval", "10", "--probe", "proxy_main=http://10.0.0.11:8080/healthcheck"]


def test_a_hanging_npu_smi_is_killed_after_the_timeout_and_scrapes_answer_meanwhile(tmp_path):
    """The real thing: a real npu-smi stand-in that blocks, a real HTTP server, a real scrape."""
    hang = tmp_path / "npu-smi"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    c = npu_exporter.Collector(str(hang), str(tmp_path / "no-hccn-tool"), timeout=1.0, interval=0.5)
    port = free_port()
    server = threading.Thread(target=npu_exporter.serve, args=(c, "127.0.0.1", port))
    server.daemon = True
    server.start()
    from urllib.request import urlopen
    deadline = time.time() + 10
    while True:
        try:
            t0 = time.time()
            body = urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2).read().decode()
            took = time.time() - t0
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    assert took < 1.0, took  # the first scrape comes while npu-smi is still blocking
    time.sleep(2.5)  # one timeout (1 s) has passed: the read is reported failed
    t0 = time.time()
    body = urlopen("http://127.0.0.1:%d/metrics" % port, timeout=2).read().decode()
    assert time.time() - t0 < 1.0
    assert sample(body, 'npuops_npu_exporter_read_error{source="npu-smi info"}') == "1"
    assert float(sample(body, 'npuops_npu_exporter_read_duration_seconds{source="npu-smi info"}')) < 2.0
    assert urlopen("http://127.0.0.1:%d/" % port, timeout=2).status == 200
    assert sys.version_info >= (3, 8)


def test_install_writes_a_runnable_exporter_once(tmp_path):
    import subprocess
    d = str(tmp_path / "exp")
    changed = npu_exporter.install(d)
    mods = ("daemon", "hccn", "image_probe", "npu_exporter", "npu_smi", "proc", "workers")
    assert sorted(changed) == ["ansible_collections/npuops/ascend/plugins/module_utils/%s.py" % m
                               for m in mods] + ["npuops-npu-exporter"]
    assert npu_exporter.install(d) == []
    assert npu_exporter.install(d, files={"npuops-npu-exporter": "changed\n"}, check_mode=True) == ["npuops-npu-exporter"]
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable  # no ansible there
    out = subprocess.run([python, os.path.join(d, "npuops-npu-exporter"), "--help"], capture_output=True,
                         text=True, timeout=30, env={"PATH": "/usr/bin:/bin"}, cwd="/", check=False)
    assert out.returncode == 0 and "--address" in out.stdout, out.stderr


def test_connections_are_bounded_in_time_backlog_and_error_log():
    """A silent client is dropped after the connection timeout; 300 connections opened at once are all accepted at
    once (a backlog of 5 made them wait for SYN retries); aborted connections log one line per kind and minute."""
    import socket
    c = npu_exporter.Collector("/nonexistent/npu-smi", "/nonexistent/hccn_tool")
    lines, now = [], [1000.0]
    httpd = npu_exporter.make_server(c, "127.0.0.1", 0, timeout=1.0, log=lines.append, clock=lambda: now[0])
    assert httpd.request_queue_size >= 128
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        t0 = time.time()
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert silent.recv(1) == b"" and time.time() - t0 < 3.0  # closed by the server after its 1 s timeout
        socks, t0 = [], time.time()
        for _attempt in range(300):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        assert time.time() - t0 < 3.0
        for s in socks:
            s.close()
        for _attempt in range(50):
            try:
                raise ConnectionResetError("reset by peer")
            except ConnectionResetError:
                httpd.handle_error(None, ("10.0.0.9", 5555))
        assert lines == ["npuops-npu-exporter: 1 connection(s) ended with ConnectionResetError (last from 10.0.0.9)"]
        now[0] += 61
        try:
            raise ConnectionResetError("reset by peer")
        except ConnectionResetError:
            httpd.handle_error(None, ("10.0.0.8", 5556))
        assert lines[1] == "npuops-npu-exporter: 50 connection(s) ended with ConnectionResetError (last from 10.0.0.8)"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_service_containers_are_reported_running_stopped_or_missing():
    answers = {"vllm": (0, "true abc123\n", ""), "vllm-pd-proxy": (0, "false def456\n", ""),
               "gone": (125, "", "Error: no such container gone\n"), "wedged": (1, "", "cannot connect to podman\n")}
    held = {"vllm": "0.23.0", "vllm_ascend": "0.23.0", "torch_npu": "2.10.0.post4", "torch": "2.10.0", "cann": "9.1.0"}
    image_runs = []

    def run(argv, timeout):
        if argv[0] == "/usr/bin/podman" and argv[1:3] == ["image", "inspect"]:
            return 0, json.dumps([{"Id": argv[3], "RepoDigests": ["q/v@sha256:" + argv[3]]}]), ""
        if argv[0] == "/usr/bin/podman" and argv[1] == "run":
            image_runs.append(argv[7])
            assert argv[2:7] == ["--rm", "--network", "none", "--entrypoint", "python3"] and timeout >= 60
            return (0, json.dumps(held), "") if argv[7] == "abc123" else (1, "", "exec failed")
        if argv[0] == "/usr/bin/podman":
            assert argv[1:4] == ["inspect", "--format", "{{.State.Running}} {{.Image}}"]
            return answers[argv[4]]
        return 1, "", "no such tool"
    c = npu_exporter.Collector("npu-smi", "hccn_tool", run=run, containers=list(answers),
                               container_cli="/usr/bin/podman", clock=lambda: 100.0)
    c.refresh()
    body = c.render()
    assert sample(body, 'npuops_container_running{container="vllm"}') == "1"
    assert sample(body, 'npuops_container_running{container="vllm-pd-proxy"}') == "0"
    assert sample(body, 'npuops_container_running{container="gone"}') == "0"
    assert 'npuops_container_running{container="wedged"}' not in body  # the CLI failed: a read error, not a dead one
    assert sample(body, 'npuops_npu_exporter_read_error{source="container wedged"}') == "1"
    # what the running image holds, read once per image id; an image whose versions could not be read is not shown
    assert sample(body, 'npuops_image_info{container="vllm",image_id="abc123",digest="sha256:abc123",vllm="0.23.0",'
                        'vllm_ascend="0.23.0",torch_npu="2.10.0.post4",cann="9.1.0"}') == "1"
    assert 'npuops_image_info{container="vllm-pd-proxy"' not in body
    c.refresh()
    assert image_runs.count("abc123") == 1 and image_runs.count("def456") == 2  # a failed read is tried again
    argv = npu_exporter.command_line("/usr/bin/python3", "/opt/e", "10.0.0.11", 9911, "npu-smi", "hccn_tool", 5, 10,
                                     containers=["vllm"], container_cli="/usr/bin/podman")
    assert argv[-4:] == ["--container-cli", "/usr/bin/podman", "--container", "vllm"]
