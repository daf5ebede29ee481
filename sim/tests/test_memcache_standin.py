"""The simulator's memcache_hybrid stand-in behaves as MemCache's documentation says where a rollout depends on it:
TLS is on unless a file says otherwise (doc/memcache_config.md), a MetaService with TLS needs its certificates, and a
client must agree with the MetaService on TLS and on the config store."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

from npuops_sim.loopback import free_port

POOL = os.path.join(os.path.dirname(__file__), "..", "npuops_sim", "image_root", "opt", "npuops-sim", "pool")


def run_meta(conf, tmp_path):
    path = tmp_path / "mmc-meta.conf"
    path.write_text(conf)
    env = dict(os.environ, PYTHONPATH=POOL, MMC_META_CONFIG_PATH=str(path))
    return subprocess.Popen([sys.executable, "-c", "from memcache_hybrid import MetaService; MetaService.main()"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)


def client(conf, tmp_path):
    path = tmp_path / "mmc-local.conf"
    path.write_text(conf)
    env = dict(os.environ, PYTHONPATH=POOL, MMC_LOCAL_CONFIG_PATH=str(path))
    return subprocess.run([sys.executable, "-c", "import sys; from memcache_hybrid import DistributedObjectStore; "
                           "sys.exit(DistributedObjectStore().init(0) & 255)"], env=env, capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)


def wait_listening(port, proc):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the MetaService did not listen on %d" % port)


def test_tls_is_on_unless_written_off_and_both_sides_must_agree(tmp_path):
    meta, store, metrics = free_port(), free_port(), free_port()
    # the metrics URL as vllm-ascend's kv_pool.md writes it (<ip>:<port>); MemCache serves /health and /metrics there
    urls = "ock.mmc.meta_service_url = tcp://127.0.0.1:%d\nock.mmc.meta_service.metrics_url = 127.0.0.1:%d\n" % (
        meta, metrics)
    local = urls + ("ock.mmc.local_service.config_store_url = tcp://127.0.0.1:%d\nock.mmc.local_service.world_size = "
                    "256\nock.mmc.local_service.protocol = device_sdma\nock.mmc.local_service.dram.size = 1GB\n" % store)
    # TLS on (nothing says otherwise) and no certificates: the MetaService does not start
    proc = run_meta(urls + "ock.mmc.meta_service.config_store_url = tcp://127.0.0.1:%d\n" % store, tmp_path)
    assert proc.wait(10) == 1 and "TLS is enabled" in proc.stdout.read()
    proc = run_meta(urls + "ock.mmc.meta_service.config_store_url = tcp://127.0.0.1:%d\nock.mmc.tls.enable = false\n"
                    % store, tmp_path)
    try:
        wait_listening(meta, proc)
        assert client(local + "ock.mmc.tls.enable = false\n", tmp_path).returncode == 0
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % metrics, timeout=5) as r:
            assert json.loads(r.read())["status"] == "ok"
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics, timeout=5) as r:
            assert r.headers["Content-Type"] == "text/plain; version=0.0.4"
            assert "\nmemcache_mount_requests_total 1\n" in r.read().decode()
        refused = client(local, tmp_path)  # TLS on by default here, off at the MetaService
        assert refused.returncode != 0 and "TLS handshake with meta service" in refused.stdout
        other = client(local.replace(":%d\nock.mmc.local_service.world" % store, ":1\nock.mmc.local_service.world")
                       + "ock.mmc.tls.enable = false\n", tmp_path)
        assert other.returncode != 0 and "differs from the meta service's" in other.stdout
    finally:
        proc.kill()
        proc.wait(10)
    gone = client(local + "ock.mmc.tls.enable = false\n", tmp_path)
    assert gone.returncode != 0 and "failed to connect to meta service tcp://127.0.0.1:%d" % meta in gone.stdout
