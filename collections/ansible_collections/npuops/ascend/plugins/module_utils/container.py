# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One named container through the docker, podman or isula CLI: desired state against actual state.

The desired spec is hashed (secrets by their digest only) into a label; an unchanged spec means no
action at all, any difference means remove and run again, and the previous spec (kept in a second label,
secrets masked) lets the caller show which fields changed. Standard library only: this runs on the nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import json
import os
import socket
import time

from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url

HASH_LABEL = "io.npuops.config-hash"
SPEC_LABEL = "io.npuops.spec"
MANAGED = ("image", "command", "env", "secret_env", "devices", "mounts", "shm_size", "network", "privileged",
           "labels", "restart_policy")


class ContainerError(Exception):
    def __init__(self, msg, **extra):
        Exception.__init__(self, msg)
        self.extra = extra


def public_spec(spec):
    """The spec as it may be shown and stored: secret values replaced by their digest."""
    out = dict((k, spec.get(k)) for k in MANAGED)
    out["secret_env"] = dict((k, "sha256:" + hashlib.sha256(str(v).encode()).hexdigest()[:16])
                             for k, v in sorted((spec.get("secret_env") or {}).items()))
    return out


def config_hash(spec):
    return hashlib.sha256(json.dumps(public_spec(spec), sort_keys=True).encode()).hexdigest()


def differences(before, after):
    """Names of the managed fields that differ between two public specs."""
    return sorted(k for k in MANAGED if (before or {}).get(k) != (after or {}).get(k))


def mount_arg(m):
    if isinstance(m, dict):
        return "%s:%s%s" % (m["src"], m.get("dst", m["src"]), ":ro" if m.get("readonly", True) else "")
    return m


class Engine(object):
    """The container CLI. `run(argv) -> (rc, stdout, stderr)` is injected (module.run_command on nodes)."""

    def __init__(self, cli, run):
        self.cli = cli
        self.name = os.path.basename(cli)
        self._run = run

    def call(self, *args):
        return self._run([self.cli] + list(args))

    def inspect(self, name):
        rc, out, err = self.call("inspect", "--type", "container", name) if self.name != "isula" else \
            self.call("inspect", name)
        if rc != 0:
            text = (out + err).lower()
            if "no such" in text or "not found" in text or "no container" in text:
                return None
            raise ContainerError("%s inspect %s failed: %s" % (self.name, name, (err or out).strip()[-500:]))
        data = json.loads(out)
        return data[0] if isinstance(data, list) else data

    @staticmethod
    def state(info):
        """-> dict(running, exit_code, started_at, hash, spec) of an inspected container."""
        st = info.get("State") or {}
        labels = (info.get("Config") or {}).get("Labels") or {}
        spec = None
        if labels.get(SPEC_LABEL):
            try:
                spec = json.loads(base64.b64decode(labels[SPEC_LABEL]).decode("utf-8"))
            except (ValueError, TypeError):
                spec = None
        return {"running": bool(st.get("Running")), "status": st.get("Status"), "exit_code": st.get("ExitCode"),
                "started_at": st.get("StartedAt"), "hash": labels.get(HASH_LABEL), "spec": spec,
                "id": info.get("Id")}

    def run_argv(self, name, spec, env_file=None):
        argv = ["run", "-d", "--name", name]
        h = config_hash(spec)
        argv += ["--label", "%s=%s" % (HASH_LABEL, h)]
        public = json.dumps(public_spec(spec), sort_keys=True).encode()
        argv += ["--label", "%s=%s" % (SPEC_LABEL, base64.b64encode(public).decode())]
        for k, v in sorted((spec.get("labels") or {}).items()):
            argv += ["--label", "%s=%s" % (k, v)]
        if spec.get("network"):
            argv += ["--net", spec["network"]]
        if spec.get("privileged"):
            argv.append("--privileged")
        if spec.get("shm_size"):
            argv += ["--shm-size", str(spec["shm_size"])]
        if spec.get("restart_policy"):
            argv += ["--restart", spec["restart_policy"]]
        for dev in spec.get("devices") or []:
            argv += ["--device", dev]
        for m in spec.get("mounts") or []:
            argv += ["-v", mount_arg(m)]
        for k, v in sorted((spec.get("env") or {}).items()):
            argv += ["-e", "%s=%s" % (k, v)]
        if env_file:
            argv += ["--env-file", env_file]
        argv.append(spec["image"])
        argv += list(spec.get("command") or [])
        return argv

    def create(self, name, spec, secret_dir):
        """docker/podman/isula run; secrets go through an env file readable only by root, never argv."""
        env_file = None
        if spec.get("secret_env"):
            if not os.path.isdir(secret_dir):
                os.makedirs(secret_dir, 0o700)
            env_file = os.path.join(secret_dir, "%s.env" % name)
            fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                for k, v in sorted(spec["secret_env"].items()):
                    f.write("%s=%s\n" % (k, v))
        try:
            rc, out, err = self.call(*self.run_argv(name, spec, env_file))
        finally:
            if env_file and os.path.exists(env_file):
                os.unlink(env_file)
        if rc != 0:
            raise ContainerError("%s run %s failed (rc=%d): %s" % (self.name, name, rc, (err or out).strip()[-1500:]))
        return out.strip()

    def start(self, name):
        rc, out, err = self.call("start", name)
        if rc != 0:
            raise ContainerError("%s start %s failed: %s" % (self.name, name, (err or out).strip()[-500:]))

    def stop(self, name, timeout=30):
        rc, out, err = self.call("stop", "-t", str(timeout), name)
        if rc != 0:
            raise ContainerError("%s stop %s failed: %s" % (self.name, name, (err or out).strip()[-500:]))

    def remove(self, name):
        rc, out, err = self.call("rm", "-f", name)
        if rc != 0 and "no such" not in (out + err).lower():
            raise ContainerError("%s rm %s failed: %s" % (self.name, name, (err or out).strip()[-500:]))

    def logs(self, name, tail=40):
        rc, out, err = self.call("logs", "--tail", str(tail), name)
        return (out + err).strip()


def http_ok(url, timeout=3.0):
    try:
        resp = open_url(url, timeout=timeout, validate_certs=False)
        try:
            return 200 <= resp.status < 300
        finally:
            resp.close()
    except (HTTPError, URLError, socket.error, OSError, ValueError):
        return False


def tcp_ok(hostport, timeout=2.0):
    host, port = hostport.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
        return True
    except (socket.error, OSError, ValueError):
        return False


def wait_ready(engine, name, url, timeout, interval=2.0, peers=(), unreachable_after=15.0, clock=time.time,
               sleep=time.sleep):
    """Poll `url` until it answers 2xx, while the container keeps running and its `peers` (host:port it must
    reach, e.g. the leader's rendezvous port) stay reachable. Bounded by `timeout` seconds.

    -> seconds waited. Raises ContainerError naming what went wrong, with the exit code and the log tail.
    """
    start = clock()
    first_miss = {}
    while True:
        info = engine.inspect(name)
        if info is None:
            raise ContainerError("container %s disappeared while waiting for %s" % (name, url))
        st = engine.state(info)
        if not st["running"]:
            raise ContainerError("container %s exited with code %s %s; last log lines:\n%s"
                                 % (name, st["exit_code"], ("before %s answered" % url) if url else
                                    "within %ds of its start" % timeout, engine.logs(name)),
                                 exit_code=st["exit_code"])
        if url and http_ok(url):
            return round(clock() - start, 1)
        now = clock()
        for peer in peers or []:
            if tcp_ok(peer):
                first_miss.pop(peer, None)
            else:
                first_miss.setdefault(peer, now)
                if now - first_miss[peer] > unreachable_after:
                    raise ContainerError("container %s cannot reach %s for %ds (its leader's rendezvous port): check "
                                         "the leader address and port it was given and the network between them; "
                                         "last log lines:\n%s" % (name, peer, unreachable_after, engine.logs(name)))
        if not url and now - start >= timeout:
            return round(now - start, 1)
        if now - start > timeout:
            raise ContainerError("%s did not answer within %ds (container %s is running); last log lines:\n%s"
                                 % (url, timeout, name, engine.logs(name)))
        sleep(interval)
