"""memcache_hybrid for the npuops simulated cluster: a stand-in for MemCache's Python surface that vLLM-Ascend and its
Kimi-K3 page use (test infrastructure, not MemCache).

- ``MetaService.main()`` (the page, section 5.1.2.1: ``python -c "from memcache_hybrid import MetaService;
  MetaService.main()"``) reads ``MMC_META_CONFIG_PATH`` and listens on ``ock.mmc.meta_service_url`` and
  ``ock.mmc.meta_service.config_store_url``.
- ``DistributedObjectStore().init(device_id, init_bm)`` (vllm-ascend's memcache_backend.py, ``_setup_store``) reads
  ``MMC_LOCAL_CONFIG_PATH``, connects to the MetaService and returns 0, or non-zero when it cannot (vllm-ascend then
  fails its ``assert res == 0``); a configuration it cannot read raises ValueError, as the real one does.
- The MetaService's HTTP endpoint on ``ock.mmc.meta_service.metrics_url`` (``<ip>:<port>`` as kv_pool.md writes it,
  or ``http://<ip>:<port>``): ``GET /health`` (JSON, status ok) and ``GET /metrics`` (Prometheus text, memcache_*
  counters), as MemCache's mmc_http_server.cpp registers them (doc/memcache_restful_api.md).
The keys are those of vllm-ascend's kv_pool.md (releases/v0.23.0, "Configuring the memcache Config File"). TLS is
on where a file does not say ``ock.mmc.tls.enable = false`` (MemCache's doc/memcache_config.md default): the
MetaService then needs its certificate files, and a client whose TLS setting differs from the MetaService's fails.
"""
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

META_KEYS = ("ock.mmc.meta_service_url", "ock.mmc.meta_service.config_store_url")
LOCAL_KEYS = ("ock.mmc.meta_service_url", "ock.mmc.local_service.config_store_url", "ock.mmc.local_service.world_size",
              "ock.mmc.local_service.protocol", "ock.mmc.local_service.dram.size")


def log(level, msg):
    sys.stdout.write("[%s] [mmc] [%s] %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), level, msg))
    sys.stdout.flush()


def read_conf(env, keys):
    path = os.environ.get(env)
    if not path:
        raise ValueError("the environment variable %s is not set" % env)
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError("cannot read %s=%s: %s" % (env, path, e))
    conf = {}
    for line in lines:
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            key, _sep, value = line.partition("=")
            conf[key.strip()] = value.strip()
    missing = [k for k in keys if k not in conf]
    if missing:
        raise ValueError("%s (%s) lacks %s" % (path, env, ", ".join(missing)))
    return conf


def tls_on(conf):
    return conf.get("ock.mmc.tls.enable", "true").lower() in ("true", "1")


TLS_FILES = (("ock.mmc.tls.ca.path", "/opt/ock/security/certs/ca.cert.pem"),
             ("ock.mmc.tls.cert.path", "/opt/ock/security/certs/server.cert.pem"),
             ("ock.mmc.tls.key.path", "/opt/ock/security/certs/server.private.key.pem"))


def endpoint(url):
    if not url.startswith("tcp://") or ":" not in url[6:]:
        raise ValueError("%r is not tcp://<ip>:<port>" % url)
    host, port = url[6:].rsplit(":", 1)
    return host, int(port)


def http_endpoint(url):
    address = url[len("http://"):] if url.startswith("http://") else url
    host, _sep, port = address.rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError("%r is not <ip>:<port>" % url)
    return host, int(port)


COUNTS = {"connections": 0}
COUNTS_LOCK = threading.Lock()


class MetricsHandler(BaseHTTPRequestHandler):
    def log_message(self, *_args):
        pass

    def do_GET(self):
        if self.path == "/health":
            body, kind = json.dumps({"status": "ok", "role": "leader", "ha_state": "serving", "service_ready": True,
                                     "leader_address": "unknown", "view_version": 0}), "application/json; charset=utf-8"
        elif self.path == "/metrics":
            with COUNTS_LOCK:
                hellos = COUNTS["connections"]
            lines = []
            for name, help_text, value in (
                    ("memcache_alloc_requests_total", "Total number of Alloc requests", 0),
                    ("memcache_get_requests_total", "Total number of Get requests", 0),
                    ("memcache_mount_requests_total", "Total number of Mount requests", hellos)):
                lines += ["# HELP %s %s" % (name, help_text), "# TYPE %s counter" % name, "%s %d" % (name, value)]
            body, kind = "\n".join(lines) + "\n", "text/plain; version=0.0.4"
        else:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class MetaService(object):
    @staticmethod
    def main():
        try:
            conf = read_conf("MMC_META_CONFIG_PATH", META_KEYS)
            meta, store = endpoint(conf[META_KEYS[0]]), endpoint(conf[META_KEYS[1]])
        except ValueError as e:
            log("ERROR", "meta service start failed: %s" % e)
            sys.exit(1)
        if tls_on(conf):
            missing = [conf.get(k, default) for k, default in TLS_FILES if not os.path.exists(conf.get(k, default))]
            if missing:
                log("ERROR", "meta service start failed: TLS is enabled (ock.mmc.tls.enable) and %s not found"
                    % ", ".join(missing))
                sys.exit(1)
        servers = []
        for address, what in ((meta, "meta service"), (store, "config store")):
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                srv.bind(address)
            except OSError as e:
                log("ERROR", "%s bind tcp://%s:%d failed: %s" % (what, address[0], address[1], e))
                sys.exit(1)
            srv.listen(256)
            servers.append((srv, what))
        metrics = conf.get("ock.mmc.meta_service.metrics_url", "127.0.0.1:8000")
        try:
            http = ThreadingHTTPServer(http_endpoint(metrics), MetricsHandler)
        except (OSError, ValueError) as e:
            log("ERROR", "metrics http server on %s failed: %s" % (metrics, e))
            sys.exit(1)
        threading.Thread(target=http.serve_forever, daemon=True).start()
        for srv, what in servers:
            threading.Thread(target=MetaService._serve, args=(srv, conf), daemon=True).start()
        log("INFO", "meta service started at %s, config store at %s" % (conf[META_KEYS[0]], conf[META_KEYS[1]]))
        while True:
            time.sleep(3600)

    @staticmethod
    def _serve(srv, conf):
        while True:
            conn, _peer = srv.accept()
            try:
                f = conn.makefile("rw")
                if f.readline().startswith("HELLO "):  # a client's store mounting (not a bare connect)
                    with COUNTS_LOCK:
                        COUNTS["connections"] += 1
                # the client checks it names the same config store and speaks the same TLS
                f.write("OK %s %s\n" % (conf[META_KEYS[1]], "tls" if tls_on(conf) else "plain"))
                f.flush()
            except OSError:
                pass
            finally:
                conn.close()


class DistributedObjectStore(object):
    def init(self, device_id, init_bm=True):
        conf = read_conf("MMC_LOCAL_CONFIG_PATH", LOCAL_KEYS)
        url = conf["ock.mmc.meta_service_url"]
        try:
            conn = socket.create_connection(endpoint(url), timeout=5.0)
            f = conn.makefile("rw")
            f.write("HELLO %s %s\n" % (device_id, bool(init_bm)))
            f.flush()
            reply = f.readline().split()
            conn.close()
        except OSError as e:
            log("ERROR", "device %s: failed to connect to meta service %s: %s" % (device_id, url, e))
            return -1
        store = conf["ock.mmc.local_service.config_store_url"]
        if len(reply) > 2 and reply[2] != ("tls" if tls_on(conf) else "plain"):
            log("ERROR", "device %s: TLS handshake with meta service %s failed (ock.mmc.tls.enable is %s here, the "
                "meta service's is %s)" % (device_id, url, tls_on(conf), reply[2] == "tls"))
            return -1
        if len(reply) < 2 or reply[1] != store:
            log("ERROR", "device %s: config store %s differs from the meta service's %s" % (
                device_id, store, reply[1] if len(reply) > 1 else "(none)"))
            return -1
        log("INFO", "device %s: connected to meta service %s" % (device_id, url))
        return 0
