# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node-side NPU exporter: npu-smi / hccn_tool readings as Prometheus text, never a hanging scrape.

Metric names and labels follow Huawei's MindCluster NPU Exporter (Ascend/ascend-npu-exporter
``collector/npu_collector.go``; its Prometheus metrics reference lists ``npu_chip_info_*`` with label ``id`` = the
chip's physical id, ``model_name``, ``pcie_bus_info``; health 1 healthy / 0 unhealthy, link 1 UP / 0 DOWN, network
1 healthy / 0 not; MindCluster 26.1.0 added -1 for "the DCMI / hccn_tool call failed"), so dashboards and queries
written for it keep working. Names it has no equivalent for are ``npuops_npu_*``.

A background thread reads the tools every ``interval`` seconds, each call bounded by ``timeout`` (its process
group killed after it, proc.run); a scrape only renders the last readings, so it answers at once even while
npu-smi hangs in the driver. A read that failed is exported as ``npuops_npu_exporter_read_error{source} 1`` and
the chips it describes report health -1. Standard library only: this runs on the nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import threading
import time

from ansible_collections.npuops.ascend.plugins.module_utils import daemon, hccn, image_probe, npu_smi, proc

DEFAULT_PORT = 9911
# reading an image's versions starts a throw-away container of it: once per image id, bounded by this
IMAGE_READ_TIMEOUT = 60
INFO = "npu-smi info"
MAPPING = "npu-smi info -m"


def escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(pairs):
    return "{" + ",".join('%s="%s"' % (k, escape(v)) for k, v in pairs) + "}" if pairs else ""


def number(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class Family(object):
    """One metric family: HELP, TYPE, samples."""

    def __init__(self, name, help_text, kind="gauge"):
        self.name, self.help, self.kind, self.samples = name, help_text, kind, []

    def add(self, pairs, value):
        if value is not None:
            self.samples.append((pairs, value))
        return self

    def text(self):
        out = ["# HELP %s %s" % (self.name, self.help), "# TYPE %s %s" % (self.name, self.kind)]
        out += ["%s%s %s" % (self.name, labels(p), number(v)) for p, v in self.samples]
        return "\n".join(out)


def health_code(state):
    """npu-smi's Health (OK, Warning, Alarm, Critical, UNKNOWN) -> MindCluster's 1 healthy / 0 unhealthy."""
    return 1 if state == "OK" else 0


def join_chips(info, mapping):
    """The table's chips with their physical id from the ``-m`` map (never card*2+chip) -> [chip dicts]."""
    by_card_chip = dict(((m["card"], m["chip"]), m) for m in mapping or [])
    chips = []
    for c in info["chips"]:
        m = by_card_chip.get((c["card"], c["chip"]))
        phy = m["phy_id"] if m else c.get("table_phy_id")
        if phy is None:
            continue
        chips.append(dict(c, phy_id=phy, logic_id=m["logic_id"] if m else None))
    return chips


def chip_families(chips, processes, failed=False):
    """Per chip metrics. `failed`: the last read failed; the chips (as last seen) report health -1 only."""
    fam = dict((f.name, f) for f in (
        Family("machine_npu_nums", "Amount of npu installed on the machine."),
        Family("npu_chip_info_health_status", "the npu health status: 1 healthy, 0 unhealthy, -1 read failed"),
        Family("npuops_npu_chip_health", "the npu health as npu-smi prints it (OK, Warning, Alarm, Critical, "
                                         "UNKNOWN): 1 for the current state"),
        Family("npu_chip_info_hbm_used_memory", "the npu hbm used memory, unit is 'MB'"),
        Family("npu_chip_info_hbm_total_memory", "the npu hbm total memory, unit is 'MB'"),
        Family("npu_chip_info_temperature", "the npu temperature, unit is 'C'"),
        Family("npu_chip_info_power", "the npu power, unit is 'W'"),
        Family("npu_chip_info_utilization", "the ai core utilization, unit is '%'"),
        Family("npu_chip_info_process_info_num", "the npu process num"),
        Family("npu_chip_info_process_info", "the npu process info, unit is 'MB'"),
    ))
    fam["machine_npu_nums"].add([], len(chips))
    for c in chips:
        ident = [("id", c["phy_id"]), ("model_name", c.get("name") or ""), ("pcie_bus_info", c.get("bus_id") or "")]
        if failed:
            fam["npu_chip_info_health_status"].add(ident, -1)
            continue
        fam["npu_chip_info_health_status"].add(ident, health_code(c.get("health")))
        fam["npuops_npu_chip_health"].add([("id", c["phy_id"]), ("health", c.get("health") or "UNKNOWN")], 1)
        for name, key in (("npu_chip_info_hbm_used_memory", "hbm_used_mb"),
                          ("npu_chip_info_hbm_total_memory", "hbm_total_mb"),
                          ("npu_chip_info_temperature", "temp_c"), ("npu_chip_info_power", "power_w"),
                          ("npu_chip_info_utilization", "aicore_pct")):
            fam[name].add(ident, c.get(key))
        mine = [p for p in processes if (p["card"], p["chip"]) == (c["card"], c["chip"])]
        fam["npu_chip_info_process_info_num"].add(ident, len(mine))
        for p in mine:
            fam["npu_chip_info_process_info"].add(
                [("id", c["phy_id"]), ("process_id", p["pid"]), ("container_id", ""), ("container_name", "")],
                p.get("memory_mb") or 0)
    return list(fam.values())


def link_code(text):
    return 1 if text == "UP" else 0


def net_code(text):
    return 1 if text == "Success" else 0


def device_families(devices):
    """Per device (physical id) link state and net health; a device whose read failed reports -1."""
    link = Family("npu_chip_info_link_status", "the npu link status: 1 UP, 0 DOWN, -1 read failed")
    net = Family("npu_chip_info_network_status", "the npu network health status: 1 Success, 0 not, -1 read failed")
    state = Family("npuops_npu_net_health", "the net health as hccn_tool prints it: 1 for the current state")
    for phy in sorted(devices, key=int):
        d = devices[phy]
        ident = [("id", phy)]
        link.add(ident, -1 if d.get("link") is None else link_code(d["link"]))
        net.add(ident, -1 if d.get("net_health") is None else net_code(d["net_health"]))
        if d.get("net_health") is not None:
            state.add([("id", phy), ("state", d["net_health"])], 1)
    return [link, net, state]


def read_families(reads, now):
    """reads: {source: {"ok": bool, "at": t, "took": s, "error": text}} -> error / age / duration families."""
    err = Family("npuops_npu_exporter_read_error", "1 when the last read of this source failed or timed out")
    age = Family("npuops_npu_exporter_read_age_seconds", "seconds since this source was last read successfully")
    took = Family("npuops_npu_exporter_read_duration_seconds", "how long the last read of this source took")
    for source in sorted(reads):
        r = reads[source]
        pairs = [("source", source)]
        err.add(pairs, 0 if r["ok"] else 1)
        if r.get("good_at") is not None:
            age.add(pairs, round(now - r["good_at"], 3))
        took.add(pairs, round(r.get("took", 0.0), 3))
    return [err, age, took]


def probe_families(probes):
    up = Family("npuops_probe_success", "1 when the endpoint answered its health check with 2xx")
    took = Family("npuops_probe_duration_seconds", "how long the health check took")
    for p in probes:
        pairs = [("probe", p["name"]), ("url", p["url"])]
        up.add(pairs, 1 if p.get("ok") else 0)
        took.add(pairs, round(p.get("took", 0.0), 3))
    return [up, took]


# docker/podman: "Error: no such container", "No such object"; isula: "No such image or container"
NO_SUCH_CONTAINER = re.compile(r"no such (container|object|image or container)", re.I)


def container_families(states, images=None):
    running = Family("npuops_container_running", "1 when the service's container runs on this node, 0 when it "
                                                 "exited or is missing (from the container CLI's inspect)")
    for name in sorted(states):
        running.add([("container", name)], states[name])
    info = Family("npuops_image_info", "1 per service container: the image it runs and what that image holds (package "
                                       "metadata of vllm, vllm_ascend, torch_npu and CANN's install info, read once "
                                       "per image id)")
    for name, held in sorted((images or {}).items()):
        versions = held.get("versions") or {}
        info.add([("container", name), ("image_id", held.get("id") or ""), ("digest", held.get("digest") or ""),
                  ("vllm", versions.get("vllm") or ""), ("vllm_ascend", versions.get("vllm_ascend") or ""),
                  ("torch_npu", versions.get("torch_npu") or ""), ("cann", versions.get("cann") or "")], 1)
    return [running, info]


def render(families):
    return "\n".join(f.text() for f in families if f.samples or f.name == "machine_npu_nums") + "\n"


class Collector(object):
    """The readings, refreshed in the background, each command bounded; `render()` never waits for a command."""

    def __init__(self, npu_smi_path, hccn_tool_path, timeout=5.0, interval=10.0, probes=(), run=None,
                 clock=time.time, http_get=None, containers=(), container_cli=None):
        self.npu_smi, self.hccn_tool = npu_smi_path, hccn_tool_path
        # the service's containers on this node and the CLI that inspects them: a headless worker has no /metrics,
        # so its engine's state reaches Prometheus only from here
        self.containers, self.container_cli = list(containers), container_cli
        self.container_states = {}
        self.container_images = {}  # container name -> image id
        self.image_reads = {}  # image id -> image_probe.read()
        self.timeout, self.interval = float(timeout), float(interval)
        self.probes = list(probes)
        self.run = run or proc.run
        self.clock = clock
        self.http_get = http_get or _http_ok
        self.lock = threading.Lock()
        self.reads = {}
        self.mapping = None
        self.chips = []
        self.processes = []
        self.info_failed = False
        self.devices = {}
        self.probe_results = []

    def _read(self, source, argv, parse):
        t0 = self.clock()
        rc, out, err = self.run(argv, self.timeout)
        took = self.clock() - t0
        value, error = None, None
        if rc == proc.TIMED_OUT:
            error = proc.describe(argv, self.timeout)
        else:
            try:
                value = parse(out + err, rc)
            except (npu_smi.NpuSmiError, ValueError, KeyError, IndexError) as e:
                error = str(e)[:300]
        with self.lock:
            previous = self.reads.get(source, {})
            self.reads[source] = {"ok": error is None, "took": took, "error": error,
                                  "good_at": self.clock() if error is None else previous.get("good_at")}
        return value

    @staticmethod
    def _parse_info(text, rc):
        info = npu_smi.parse_info(text)
        if rc != 0 and not info["chips"]:
            raise ValueError("npu-smi info exited %d: %s" % (rc, text.strip()[-200:]))
        return info

    @staticmethod
    def _parse_mapping(text, rc):
        return npu_smi.parse_mapping(text)

    def _read_device(self, phy):
        def item(name, parse):
            def p(text, rc):
                value = parse(text)
                if value is None:
                    raise ValueError("hccn_tool -i %s -%s -g: %s" % (phy, name, text.strip()[-200:]))
                return value
            return self._read("hccn_tool -i %s -%s" % (phy, name), [self.hccn_tool, "-i", str(phy), "-%s" % name, "-g"],
                              p)
        return {"link": item("link", hccn.parse_link), "net_health": item("net_health", hccn.parse_net_health)}

    def refresh(self):
        """One round of reads, in parallel so that one hung command costs at most `timeout` in all."""
        results = {}

        def info():
            results["info"] = self._read(INFO, [self.npu_smi, "info"], self._parse_info)

        def mapping():
            if self.mapping is None:
                results["mapping"] = self._read(MAPPING, [self.npu_smi, "info", "-m"], self._parse_mapping)

        threads = [threading.Thread(target=f) for f in (info, mapping)]
        for t in threads:
            t.daemon = True
            t.start()
        for t in threads:
            t.join(self.timeout + 5)
        if results.get("mapping"):
            self.mapping = results["mapping"]
        with self.lock:
            info_value = results.get("info")
            if info_value is not None:
                self.chips = join_chips(info_value, self.mapping)
                self.processes = info_value["processes"]
                self.info_failed = False
            elif INFO in self.reads:
                self.info_failed = True
        phys = sorted(set(m["phy_id"] for m in self.mapping or []))
        devices = {}

        def device(phy):
            devices[str(phy)] = self._read_device(phy)

        threads = [threading.Thread(target=device, args=(phy,)) for phy in phys]
        threads += [threading.Thread(target=self._probe, args=(p,)) for p in self.probes]
        if self.container_cli:
            threads += [threading.Thread(target=self._container, args=(name,)) for name in self.containers]
        for t in threads:
            t.daemon = True
            t.start()
        for t in threads:
            t.join(self.timeout + 5)
        with self.lock:
            self.devices = devices

    def _container(self, name):
        """Whether the container runs (`inspect`, bounded): 1 running, 0 stopped or missing, None when the CLI
        failed (reported as a read error, not as a dead engine)."""
        argv = [self.container_cli, "inspect", "--format", "{{.State.Running}} {{.Image}}", name]
        image = {}

        def parse(text, rc):
            words = text.strip().splitlines()[-1].split() if text.strip() else []
            if rc == 0 and words and words[0].lower() in ("true", "false"):
                image["id"] = words[1] if len(words) > 1 else None
                return 1 if words[0].lower() == "true" else 0
            if rc != 0 and NO_SUCH_CONTAINER.search(text):
                return 0
            raise ValueError("%s inspect %s exited %d: %s" % (self.container_cli, name, rc, text.strip()[-200:]))
        value = self._read("container %s" % name, argv, parse)
        with self.lock:
            self.container_states[name] = value
            if image.get("id"):
                self.container_images[name] = image["id"]
            known = image.get("id") in self.image_reads
        if image.get("id") and not known:
            held = image_probe.read(self.run, self.container_cli, image["id"], max(self.timeout, IMAGE_READ_TIMEOUT))
            if held.get("versions"):  # a failed read is tried again next round
                with self.lock:
                    self.image_reads[image["id"]] = held

    def _probe(self, p):
        t0 = self.clock()
        ok = self.http_get(p["url"], self.timeout)
        result = dict(p, ok=ok, took=self.clock() - t0)
        with self.lock:
            self.probe_results = [r for r in self.probe_results if r["name"] != p["name"]] + [result]

    def render(self):
        with self.lock:
            families = chip_families(self.chips, self.processes, failed=self.info_failed)
            families += device_families(self.devices)
            families += read_families(self.reads, self.clock())
            families += probe_families(sorted(self.probe_results, key=lambda r: r["name"]))
            families += container_families(self.container_states, dict(
                (name, self.image_reads[i]) for name, i in self.container_images.items() if i in self.image_reads))
        return render(families)

    def loop(self, stop):
        while not stop.is_set():
            started = self.clock()
            try:
                self.refresh()
            except Exception:  # pylint: disable=broad-except
                pass  # a round that broke is reported by its read errors; the next round tries again
            stop.wait(max(0.5, self.interval - (self.clock() - started)))


def _http_ok(url, timeout):
    status = daemon.http_status(url, timeout)
    return status is not None and 200 <= status < 300


def parse_probe(text):
    """``name=url`` -> {name, url}."""
    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise ValueError("a probe is name=http://host:port/path, got %r" % text)
    return {"name": name, "url": url}


# A scrape is one short request: a connection that sends nothing for this long is closed (a stuck client cannot hold
# a thread), the kernel queues this many connections not yet accepted (socketserver's default is 5: 400 connections
# opened at once took a minute), and errors of aborted connections are one line per kind and minute on stderr (the
# default handler prints a traceback for each into the log, which may be RAM-backed).
CONNECTION_TIMEOUT = 10.0
LISTEN_BACKLOG = 128
ERROR_LOG_INTERVAL = 60.0


def make_server(collector, address, port, timeout=CONNECTION_TIMEOUT, log=None, clock=time.time):
    """The HTTP server of /metrics (a thread per connection; rendering runs no command)."""
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from socketserver import ThreadingMixIn
    write = log or (lambda line: sys.stderr.write(line + "\n"))
    errors = {}  # kind -> [count since the last line, time of the last line]
    lock = threading.Lock()

    class Server(ThreadingMixIn, HTTPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = LISTEN_BACKLOG

        def handle_error(self, request, client_address):
            kind = sys.exc_info()[0].__name__ if sys.exc_info()[0] else "error"
            now = clock()
            with lock:
                entry = errors.setdefault(kind, [0, None])
                entry[0] += 1
                if entry[1] is not None and now - entry[1] < ERROR_LOG_INTERVAL:
                    return
                count, entry[0], entry[1] = entry[0], 0, now
            write("npuops-npu-exporter: %d connection(s) ended with %s (last from %s)"
                  % (count, kind, client_address[0] if client_address else "?"))

    class Handler(BaseHTTPRequestHandler):
        def setup(self):
            self.timeout = timeout  # StreamRequestHandler: the connection's socket timeout
            BaseHTTPRequestHandler.setup(self)

        def do_GET(self):  # noqa: N802 (the http.server API)
            if self.path.split("?")[0] == "/metrics":
                body = collector.render().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            elif self.path == "/":
                body = b"npuops NPU exporter: /metrics\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
            else:
                body = b"not found\n"
                self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Server((address, int(port)), Handler)


def serve(collector, address, port):
    """Serve /metrics until killed, the readings refreshed in the background."""
    stop = threading.Event()
    worker = threading.Thread(target=collector.loop, args=(stop,))
    worker.daemon = True
    worker.start()
    httpd = make_server(collector, address, port)
    try:
        httpd.serve_forever()
    finally:
        stop.set()


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="npuops-npu-exporter", description="NPU metrics for Prometheus")
    ap.add_argument("--address", required=True)
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--npu-smi", default="npu-smi")
    ap.add_argument("--hccn-tool", default=hccn.DEFAULT_HCCN_TOOL)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--probe", action="append", default=[], help="name=url: a health check to export")
    ap.add_argument("--container", action="append", default=[], help="a container of the service to report")
    ap.add_argument("--container-cli", help="the container CLI that inspects them (docker, podman, isula)")
    args = ap.parse_args(argv)
    collector = Collector(args.npu_smi, args.hccn_tool, timeout=args.timeout, interval=args.interval,
                          probes=[parse_probe(p) for p in args.probe], containers=args.container,
                          container_cli=args.container_cli)
    serve(collector, args.address, args.port)


def command_line(python, install_dir, address, port, npu_smi_path, hccn_tool_path, timeout, interval, probes=(),
                 containers=(), container_cli=None):
    """The exporter's command line (the same for the background process and the systemd unit)."""
    argv = [python, install_dir.rstrip("/") + "/npuops-npu-exporter", "--address", str(address), "--port", str(port),
            "--npu-smi", npu_smi_path, "--hccn-tool", hccn_tool_path, "--timeout", "%g" % float(timeout),
            "--interval", "%g" % float(interval)]
    for p in probes or ():
        argv += ["--probe", "%s=%s" % (p["name"], p["url"])]
    if containers and container_cli:
        argv += ["--container-cli", container_cli]
        for name in containers:
            argv += ["--container", name]
    return argv


LAUNCHER = """#!/usr/bin/python3
# npuops NPU exporter: Prometheus text from npu-smi / hccn_tool (installed by npuops.ascend.npu_exporter).
# The code is the collection's module_utils (npu_exporter.py and its parsers), next to this file.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ansible_collections.npuops.ascend.plugins.module_utils import npu_exporter  # noqa: E402

if __name__ == "__main__":
    npu_exporter.main()
"""
PACKAGE = "ansible_collections/npuops/ascend/plugins/module_utils"


def sources():
    """{relative path: text} of the exporter: the launcher and the module_utils it imports (their own source, as
    the module carries them to the node)."""
    import inspect
    from ansible_collections.npuops.ascend.plugins.module_utils import workers
    out = {"npuops-npu-exporter": LAUNCHER}
    for mod in (daemon, npu_smi, hccn, image_probe, proc, workers):
        out["%s/%s.py" % (PACKAGE, mod.__name__.rsplit(".", 1)[-1])] = inspect.getsource(mod)
    out["%s/npu_exporter.py" % PACKAGE] = inspect.getsource(inspect.getmodule(sources))
    return out


def install(install_dir, files=None, check_mode=False):
    """Write the exporter's files under install_dir where they differ -> the relative paths changed."""
    import os
    changed = []
    for rel, text in sorted((files or sources()).items()):
        path = os.path.join(install_dir, rel)
        try:
            with open(path) as f:
                same = f.read() == text
        except (OSError, IOError):
            same = False
        if same:
            continue
        changed.append(rel)
        if check_mode:
            continue
        d = os.path.dirname(path)
        if not os.path.isdir(d):
            os.makedirs(d, 0o755)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755 if rel == "npuops-npu-exporter" else 0o644)
        os.rename(tmp, path)
    return changed
