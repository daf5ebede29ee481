# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One named container through the docker, podman or isula CLI: desired state against actual state.

The desired spec is hashed into a label (secrets by a keyed digest only); an unchanged spec means no action at
all, any difference means remove and run again. The previous spec is kept in a second label (secrets masked),
so the difference tracker (``changes``) can say what changed field by field - each vLLM flag, each environment
key, the image, each device and mount - as community.docker's DifferenceTracker does.

``transition`` is the state machine (what to do from what is there); ``converge`` carries it out. The module
file only wires arguments, check mode and diff to them. Standard library only: this runs on the nodes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import hmac
import json
import os
import re
import socket
import time

from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url

from ansible_collections.npuops.ascend.plugins.module_utils import proc

HASH_LABEL = "io.npuops.config-hash"
SPEC_LABEL = "io.npuops.spec"
MANAGED = ("image", "command", "env", "secret_env", "devices", "mounts", "shm_size", "network", "privileged",
           "labels", "restart_policy")
# A node-local random key for the secrets' digests: a label shows a digest nobody can test guesses against
# without root on the node (a plain sha256 prefix of an API key can be brute-forced from `inspect`).
DIGEST_KEY = "/var/lib/npuops/secret-digest.key"
UNKNOWN_DIGEST = "(digest key missing)"
# the argument spec of the option `engine` that every module of the action group npuops.ascend.container takes
# (doc fragment container_engine)
ENGINES = ("docker", "podman", "isula")  # the container CLIs npuops drives; the YAML docs and specs follow (unit test)
ENGINE_OPTION = dict(type="str", choices=list(ENGINES), default="docker")
ACTIONS = ("none", "create", "recreate", "start", "stop", "remove")


class ContainerError(Exception):
    def __init__(self, msg, **extra):
        Exception.__init__(self, msg)
        self.extra = extra


# ------------------------------------------------------------------------------------------ specs and diffs

def digest_key(path=DIGEST_KEY, create=False):
    """The node's digest key (created, root-only, when `create`); None when it does not exist yet."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except (IOError, OSError):
        if not create:
            return None
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    key = os.urandom(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def secret_digest(value, key):
    if key is None:
        return UNKNOWN_DIGEST
    return "hmac-sha256:" + hmac.new(key, str(value).encode("utf-8"), hashlib.sha256).hexdigest()[:32]


def public_spec(spec, key=None):
    """The spec as it may be shown and stored: secret values replaced by their keyed digest."""
    out = dict((k, spec.get(k)) for k in MANAGED)
    out["secret_env"] = dict((k, secret_digest(v, key)) for k, v in sorted((spec.get("secret_env") or {}).items()))
    return out


def config_hash(spec, key=None):
    return hashlib.sha256(json.dumps(public_spec(spec, key), sort_keys=True).encode()).hexdigest()


def flag_words(argv, flag):
    """The words after `flag` in an argv, up to the next flag ([] when it is absent)."""
    argv = list(argv or [])
    if flag not in argv:
        return []
    i, out = argv.index(flag) + 1, []
    while i < len(argv) and not str(argv[i]).startswith("--"):
        out.append(str(argv[i]))
        i += 1
    return out


def argv_flags(argv):
    """["vllm", "serve", "/m", "--tp", "16", "--headless"] -> ("vllm serve /m", {"--tp": "16", "--headless": True}).

    A token starting with "--" is a flag; the next token is its value unless it is a flag itself."""
    argv = list(argv or [])
    head = []
    while argv and not argv[0].startswith("--"):
        head.append(argv.pop(0))
    flags = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values = [argv[i + 1]]
            i += 2
            while i < len(argv) and not argv[i].startswith("--"):  # nargs="+" (the proxy's host lists)
                values.append(argv[i])
                i += 1
            flags[token] = values[0] if len(values) == 1 else " ".join(values)
        else:
            flags[token] = True
            i += 1
    return " ".join(head), flags


def readable(public):
    """A public spec shaped for a diff: the command as its program plus one entry per flag, sorted lists."""
    if not public:
        return {}
    out = dict(public)
    program, flags = argv_flags(public.get("command"))
    out["command"] = dict(flags, program=program)
    for key in ("devices", "mounts"):
        out[key] = sorted(public.get(key) or [])
    return out


def changes(before, after):
    """What differs between two public specs, field by field: [{field, item, before, after}].

    `item` is the flag of the command, the key of env / secret_env / labels, or the device / mount; None for a
    scalar field. A whole field is reported once when the container was not made by npuops (no spec label)."""
    out = []
    if before is None:
        return [{"field": "(all)", "item": None, "before": None, "after": "created"}]
    b, a = readable(before), readable(after)
    for field in MANAGED:
        bv, av = b.get(field), a.get(field)
        if bv == av:
            continue
        if field in ("command", "env", "secret_env", "labels"):
            bv, av = bv or {}, av or {}
            for item in sorted(set(bv) | set(av)):
                if bv.get(item) != av.get(item):
                    secret = field == "secret_env"
                    out.append({"field": field, "item": item, "before": "(secret)" if secret and item in bv
                                else bv.get(item), "after": "(secret)" if secret and item in av else av.get(item)})
        elif field in ("devices", "mounts"):
            for item in sorted(set(bv or []) ^ set(av or [])):
                out.append({"field": field, "item": item, "before": item in (bv or []), "after": item in (av or [])})
        else:
            out.append({"field": field, "item": None, "before": bv, "after": av})
    return out


def describe(change):
    """One change as a line: `--max-num-seqs: 16 -> 8`, `env HCCL_BUFFSIZE: 256 -> 512`, `devices +/dev/davinci3`."""
    field, item, before, after = change["field"], change["item"], change["before"], change["after"]
    if field in ("devices", "mounts"):
        return "%s %s%s" % (field, "+" if after else "-", item)
    if field == "command":
        return "%s: %s -> %s" % (item, _show(before), _show(after))
    if item is not None:
        return "%s %s: %s -> %s" % (field, item, _show(before), _show(after))
    return "%s: %s -> %s" % (field, _show(before), _show(after))


def _show(value):
    if value is None:
        return "(unset)"
    if value is True:
        return "(set)"
    return str(value)


# ------------------------------------------------------------------------------------------ the engine CLI

def present_mounts(mounts, optional, exists=os.path.exists):
    """The bind mounts `src:dst[:opts]` to use, and the sources left out: a source listed in `optional` is
    mounted only where it exists on this node (a missing bind source fails the container's start)."""
    optional = set(optional or ())
    kept, missing = [], []
    for m in mounts:
        src = m.split(":", 1)[0]
        if src in optional and not exists(src):
            missing.append(src)
        else:
            kept.append(m)
    return kept, missing


def mount_arg(m):
    if isinstance(m, dict):
        return "%s:%s%s" % (m["src"], m.get("dst", m["src"]), ":ro" if m.get("readonly", True) else "")
    return m


def secret_name(container, key):
    return "npuops-%s-%s" % (re.sub(r"[^a-z0-9]+", "-", container.lower()), re.sub(r"[^a-z0-9]+", "-", key.lower()))


SECRET_WRAPPER = "npuops-secrets"


def secret_wrapper(keys):
    """The command prefix that exports the mounted secret files (/run/secrets/<KEY>) as environment, then execs
    the real command: `sh -c '...; exec "$@"' npuops-secrets vllm serve ...`. It holds the keys' names only."""
    script = "".join('export %s="$(cat /run/secrets/%s)"; ' % (k, k) for k in keys) + 'exec "$@"'
    return ["/bin/sh", "-c", script, SECRET_WRAPPER]


def unwrapped(argv):
    """A container's command without the secret wrapper (what the plan rendered)."""
    argv = list(argv or [])
    if len(argv) >= 4 and argv[:2] == ["/bin/sh", "-c"] and argv[3] == SECRET_WRAPPER:
        return argv[4:]
    return argv


class Engine(object):
    """The container CLI. `run(argv, timeout, data=None) -> (rc, stdout, stderr)` is injected (proc.run on the
    nodes); every call is bounded by `timeout` seconds."""

    def __init__(self, cli, run=proc.run, timeout=60):
        self.cli = cli
        self.name = os.path.basename(cli)
        self._run = run
        self.timeout = timeout

    def call(self, *args, **kw):
        argv = [self.cli] + list(args)
        rc, out, err = self._run(argv, kw.get("timeout", self.timeout), kw.get("data"))
        if rc == proc.TIMED_OUT:
            what = proc.describe(argv, kw.get("timeout", self.timeout))
            raise ContainerError("%s (is the %s daemon wedged?)" % (what, self.name))
        return rc, out, err

    def inspect(self, name):
        rc, out, err = self.call("inspect", "--type", "container", name) if self.name != "isula" else \
            self.call("inspect", name)
        if rc != 0:
            text = (out + err).lower()
            if "no such" in text or "not found" in text or "no container" in text:
                return None
            raise ContainerError("%s inspect %s failed: %s" % (self.name, name, (err or out).strip()[-500:]))
        data = json.loads(out)
        if isinstance(data, list):
            return data[0] if data else None
        return data

    @staticmethod
    def state(info):
        """-> dict(running, status, exit_code, started_at, hash, spec, id, labels) of an inspected container."""
        st = info.get("State") or {}
        labels = (info.get("Config") or {}).get("Labels") or {}
        spec = None
        if labels.get(SPEC_LABEL):
            try:
                spec = json.loads(base64.b64decode(labels[SPEC_LABEL]).decode("utf-8"))
            except (ValueError, TypeError):
                spec = None
        return {"running": bool(st.get("Running")) and not st.get("Paused"), "status": st.get("Status"),
                "exit_code": st.get("ExitCode"), "started_at": st.get("StartedAt"), "pid": st.get("Pid"),
                "hash": labels.get(HASH_LABEL), "spec": spec, "id": info.get("Id"), "image_id": info.get("Image"),
                "labels": dict((k, v) for k, v in labels.items() if k not in (HASH_LABEL, SPEC_LABEL))}

    def uses_secret_store(self):
        """podman keeps secrets in its own store. They are mounted as files (`--secret ...,type=mount`) and a
        two-line shell wrapper exports them before it execs the command, because podman 4.3 shows the value of an
        env-type secret in `inspect` (Config.Env); this way inspect shows the secret's name and the wrapper, never
        the value. docker has secrets only in swarm mode and isula none: there the value reaches the container
        through an env file and is visible to `inspect` (docs/serve.md)."""
        return self.name == "podman"

    def run_argv(self, name, spec, key=None, env_file=None):
        argv = ["run", "-d", "--name", name]
        argv += ["--label", "%s=%s" % (HASH_LABEL, config_hash(spec, key))]
        public = json.dumps(public_spec(spec, key), sort_keys=True).encode()
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
        command = list(spec.get("command") or [])
        if spec.get("secret_env"):
            if self.uses_secret_store():
                keys = sorted(spec["secret_env"])
                for k in keys:
                    argv += ["--secret", "%s,type=mount,target=%s" % (secret_name(name, k), k)]
                command = secret_wrapper(keys) + command
            elif env_file:
                argv += ["--env-file", env_file]
        argv.append(spec["image"])
        argv += command
        return argv

    def create(self, name, spec, secret_dir, key=None):
        """run; secrets go through podman's secret store (value on stdin) or an env file readable only by root,
        removed right after: never through an argv."""
        env_file = None
        secrets = spec.get("secret_env") or {}
        if secrets and self.uses_secret_store():
            for k, v in sorted(secrets.items()):
                self.call("secret", "rm", secret_name(name, k))
                rc, out, err = self.call("secret", "create", secret_name(name, k), "-", data=str(v))
                if rc != 0:
                    why = (err or out).strip()[-300:]
                    raise ContainerError("%s secret create %s failed: %s" % (self.name, secret_name(name, k), why))
        elif secrets:
            if not os.path.isdir(secret_dir):
                os.makedirs(secret_dir, 0o700)
            env_file = os.path.join(secret_dir, "%s.env" % name)
            fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                for k, v in sorted(secrets.items()):
                    f.write("%s=%s\n" % (k, v))
        try:
            rc, out, err = self.call(*self.run_argv(name, spec, key, env_file))
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
        rc, out, err = self.call("stop", "-t", str(timeout), name, timeout=timeout + self.timeout)
        if rc != 0:
            raise ContainerError("%s stop %s failed: %s" % (self.name, name, (err or out).strip()[-500:]))

    def remove(self, name, secrets=()):
        rc, out, err = self.call("rm", "-f", name)
        if rc != 0 and "no such" not in (out + err).lower():
            raise ContainerError("%s rm %s failed: %s" % (self.name, name, (err or out).strip()[-500:]))
        if self.uses_secret_store():
            for k in secrets:
                self.call("secret", "rm", secret_name(name, k))

    def logs(self, name, tail=40, since=None, timestamps=False):
        """The last lines of the container's log; with `since` (its StartedAt) only this run's lines; `timestamps`
        prefixes each line with the time the engine wrote it (RFC 3339, every engine's -t)."""
        args = ["logs", "--tail", str(tail)]
        if since and self.name != "isula":
            args += ["--since", since]
        if timestamps:
            args.append("--timestamps")
        rc, out, err = self.call(*(args + [name]))
        return (out + err).strip()


def ours(state):
    """The one ownership rule: a container is the service's when npuops made it (it carries the config label).
    A container of the same name without it belongs to someone else: preflight, status, deploy and stop leave it
    alone and name it, unless the operator lets npuops take it over."""
    return bool(state and state.get("hash"))


FOREIGN = ("a container named %s that npuops did not make is here (image %s, %s); npuops does not %s it. Remove or "
           "rename it, or set npuops_takeover: true to let npuops %s it")


def describe_container(engine, name, log_lines=20, read_image=None):
    """What status reports of one container: exists, running, status, exit code, start, npuops labels, ours, the
    spec npuops ran it with (None for a container npuops did not make), and (when it does not run) the log lines
    of its last start. ``read_image(image id)`` (image_probe.read), when given, adds what the image of a running
    container holds: its digest and package versions."""
    info = engine.inspect(name)
    if not info:
        return {"exists": False, "running": False, "ours": False}
    st = engine.state(info)
    out = {"exists": True, "running": st["running"], "status": st["status"], "exit_code": st["exit_code"],
           "started_at": st["started_at"], "ours": ours(st), "labels": st["labels"], "id": st["id"],
           # the spec npuops ran it with (its label; secrets as keyed digests only): what a rollout restores
           "spec": st["spec"], "log": ""}
    if not st["running"]:
        out["log"] = engine.logs(name, tail=log_lines, since=st["started_at"])
    elif read_image and st["image_id"]:
        out["image"] = read_image(st["image_id"])
    return out


# ------------------------------------------------------------------------------------------ the state machine

def transition(current, state, wanted_hash=None, recreate=False):
    """What to do with the container `current` (Engine.state(), or None when there is none) to reach `state`:
    one of ACTIONS. `ready` never changes anything (it only waits)."""
    if state == "absent":
        return "remove" if current else "none"
    if state == "stopped":
        return "stop" if current and current["running"] else "none"
    if state == "ready":
        return "none"
    if current is None:
        return "create"
    if current["hash"] != wanted_hash or recreate:
        return "recreate"
    if not current["running"]:
        return "start"
    return "none"


def converge(engine, name, spec, state, recreate=False, wait=None, check_mode=False, secret_dir="/run/npuops",
             key_path=DIGEST_KEY, waiter=None, stop_timeout=30, takeover=False):
    """Bring container `name` to `state`; -> result dict (changed, action, changes, changed_fields, diff, ...).

    Check mode reports the action, the changes and the diff it would make and waits for nothing. `wait` is the
    module's wait_ready options (or None); `waiter` replaces wait_ready in tests. A container of that name that
    npuops did not make (`ours`) is refused, in check mode too, unless `takeover`. Raises ContainerError."""
    key = digest_key(key_path, create=False)
    info = engine.inspect(name)
    current = engine.state(info) if info else None
    result = {"changed": False, "action": "none", "changes": [], "changed_fields": []}
    if current:
        result.update(container_id=current["id"], started_at=current["started_at"] if current["running"] else None)
    if state == "ready":
        if check_mode:
            result["msg"] = "check mode: not waiting for %s" % name
            return result
        if current is None:
            raise ContainerError("there is no such container")
        if wait:
            result["ready_after"] = (waiter or wait_ready)(engine, name, wait.get("url"), wait["timeout"],
                                                           wait.get("interval", 2), wait.get("peers") or [],
                                                           wait.get("unreachable_after", 15),
                                                           missed=wait.get("missed"))
        elif not current["running"]:
            raise ContainerError("exited with code %s; last log lines:\n%s"
                                 % (current["exit_code"], engine.logs(name, since=current["started_at"])),
                                 exit_code=current["exit_code"])
        st = engine.state(engine.inspect(name))
        result.update(container_id=st["id"], started_at=st["started_at"])
        return result

    if state == "started" and spec.get("secret_env") and key is None and not check_mode:
        key = digest_key(key_path, create=True)
    wanted = config_hash(spec, key) if state == "started" else None
    action = transition(current, state, wanted, recreate)
    if action != "none" and current is not None and not ours(current) and not takeover:
        verb = {"stop": "stop", "remove": "remove"}.get(action, "replace")
        raise ContainerError(FOREIGN % (name, info.get("Config", {}).get("Image") or info.get("ImageName") or "?",
                                        "running" if current["running"] else current["status"], verb, verb),
                             foreign=True)
    result.update(changed=action != "none", action=action)
    if state == "started":
        after = public_spec(spec, key)
        result["config_hash"] = wanted
        if action in ("create", "recreate"):
            found = changes(current["spec"] if current else None, after) if (current is None or current["spec"]) \
                else [{"field": "(all)", "item": None, "before": "(not made by npuops)", "after": "replaced"}]
            if action == "recreate" and not found:
                found = [{"field": "(forced)", "item": None, "before": None, "after": "recreate"}]
            result["changes"] = [describe(c) for c in found]
            result["changed_fields"] = sorted(set(c["field"] for c in found))
            result["diff"] = {"before": readable((current or {}).get("spec")) if current else {},
                              "after": readable(after)}
    elif action == "remove":
        result["diff"] = {"before": readable(current.get("spec")) if current.get("spec") else {"name": name},
                          "after": {}}
    if check_mode or action == "none" and not (state == "started" and wait):
        return result
    if action == "recreate":
        engine.remove(name)
    if action in ("create", "recreate"):
        engine.create(name, spec, secret_dir, key)
    elif action == "start":
        engine.start(name)
    elif action == "stop":
        engine.stop(name, stop_timeout)
    elif action == "remove":
        engine.remove(name, secrets=sorted((spec or {}).get("secret_env") or {}))
        result.pop("started_at", None)
        return result
    if state == "started" and wait:
        result["ready_after"] = (waiter or wait_ready)(engine, name, wait.get("url"), wait["timeout"],
                                                       wait.get("interval", 2), wait.get("peers") or [],
                                                       wait.get("unreachable_after", 15), missed=wait.get("missed"))
    info = engine.inspect(name)
    if info:
        st = engine.state(info)
        result.update(container_id=st["id"], started_at=st["started_at"] if st["running"] else None)
    return result


# ------------------------------------------------------------------------------------------ readiness

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
               sleep=time.sleep, missed=None):
    """Poll `url` until it answers 2xx, while the container keeps running and its `peers` (host:port it must
    reach, e.g. the leader's rendezvous port) stay reachable. Bounded by `timeout` seconds.

    `missed` ({peer: seconds already unreachable}) continues the count of an earlier slice of the same wait; a
    timeout carries the count on (extra `missed`) so a wait cut in slices judges peers as one long wait would.
    -> seconds waited. Raises ContainerError naming what went wrong, with the exit code and this run's log tail.
    """
    start = clock()
    first_miss = dict((p, start - float(s)) for p, s in (missed or {}).items())
    while True:
        info = engine.inspect(name)
        if info is None:
            raise ContainerError("container %s disappeared while waiting for %s" % (name, url))
        st = engine.state(info)
        if not st["running"]:
            raise ContainerError("container %s exited with code %s %s; last log lines:\n%s"
                                 % (name, st["exit_code"], ("before %s answered" % url) if url else
                                    "within %ds of its start" % timeout, engine.logs(name, since=st["started_at"])),
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
                                         "last log lines:\n%s" % (name, peer, unreachable_after,
                                                                  engine.logs(name, since=st["started_at"])))
        if not url and now - start >= timeout:
            return round(now - start, 1)
        if now - start > timeout:
            raise ContainerError("%s did not answer within %ds (container %s is running); last log lines:\n%s"
                                 % (url, timeout, name, engine.logs(name, since=st["started_at"])),
                                 timed_out=True, missed=dict((p, round(now - t, 1)) for p, t in first_miss.items()))
        sleep(interval)
