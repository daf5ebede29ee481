# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import container as ct

SPEC = {"image": "quay.io/ascend/vllm-ascend:v0.23.0-a3", "command": ["vllm", "serve", "/m"], "env": {"A": "1"},
        "secret_env": {"VLLM_API_KEY": "hunter2"}, "devices": ["/dev/davinci0"], "mounts": ["/etc/hccn.conf:/etc/hccn.conf:ro"],
        "shm_size": "16g", "network": "host", "privileged": False, "labels": {}, "restart_policy": None}


class FakeCli(object):
    """docker's CLI over an in-memory table of containers, recording every call."""

    def __init__(self):
        self.containers = {}
        self.calls = []
        self.logs = "line1\nline2"

    def __call__(self, argv):
        self.calls.append(argv)
        verb = argv[1]
        if verb == "inspect":
            name = argv[-1]
            if name not in self.containers:
                return 1, "", "Error: No such container: %s" % name
            return 0, json.dumps([self.containers[name]]), ""
        if verb == "run":
            name = argv[argv.index("--name") + 1]
            labels = dict(a.split("=", 1) for i, a in enumerate(argv) if i and argv[i - 1] == "--label")
            env_file = argv[argv.index("--env-file") + 1] if "--env-file" in argv else None
            self.env_file_seen = (env_file, open(env_file).read() if env_file else None,
                                  oct(os.stat(env_file).st_mode & 0o777) if env_file else None)
            self.containers[name] = {"Id": "c0ffee", "State": {"Running": True, "ExitCode": 0, "StartedAt": "t1"},
                                     "Config": {"Labels": labels}}
            return 0, "c0ffee\n", ""
        if verb == "rm":
            self.containers.pop(argv[-1], None)
            return 0, "", ""
        if verb == "stop":
            self.containers[argv[-1]]["State"]["Running"] = False
            return 0, "", ""
        if verb == "start":
            self.containers[argv[-1]]["State"]["Running"] = True
            return 0, "", ""
        if verb == "logs":
            return 0, self.logs, ""
        return 1, "", "unknown verb"


def test_create_then_nothing_then_recreate_on_change(tmp_path):
    cli = FakeCli()
    eng = ct.Engine("/usr/bin/docker", cli)
    assert eng.inspect("vllm") is None
    eng.create("vllm", SPEC, str(tmp_path / "run"))
    st = eng.state(eng.inspect("vllm"))
    assert st["running"] and st["hash"] == ct.config_hash(SPEC)
    assert st["spec"]["secret_env"]["VLLM_API_KEY"].startswith("sha256:")
    run = cli.calls[-1]
    assert "hunter2" not in " ".join(run)  # the secret is in no argv
    env_file, content, mode = cli.env_file_seen
    assert content == "VLLM_API_KEY=hunter2\n" and mode == "0o600" and not os.path.exists(env_file)
    changed = dict(SPEC, env={"A": "2"})
    assert ct.config_hash(changed) != st["hash"]
    assert ct.differences(st["spec"], ct.public_spec(changed)) == ["env"]
    assert ct.differences(st["spec"], ct.public_spec(dict(SPEC, secret_env={"VLLM_API_KEY": "new"}))) == ["secret_env"]


def test_run_argv_carries_every_managed_field():
    argv = ct.Engine("/usr/bin/podman", FakeCli()).run_argv("vllm", SPEC)
    joined = " ".join(argv)
    for part in ("--net host", "--shm-size 16g", "--device /dev/davinci0", "-v /etc/hccn.conf:/etc/hccn.conf:ro",
                 "-e A=1"):
        assert part in joined
    assert argv[-4:] == [SPEC["image"], "vllm", "serve", "/m"]


def clock_and_sleep():
    now = [0.0]
    return (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))


def test_wait_ready_fails_fast_when_the_container_exits(tmp_path):
    cli = FakeCli()
    eng = ct.Engine("/usr/bin/docker", cli)
    eng.create("vllm", SPEC, str(tmp_path))
    cli.containers["vllm"]["State"].update(Running=False, ExitCode=1)
    clock, sleep = clock_and_sleep()
    with pytest.raises(ct.ContainerError, match=r"(?s)exited with code 1 before http://x/health answered.*line2") as e:
        ct.wait_ready(eng, "vllm", "http://x/health", 600, clock=clock, sleep=sleep)
    assert e.value.extra["exit_code"] == 1


def test_wait_ready_names_an_unreachable_peer_and_respects_the_timeout(tmp_path, monkeypatch):
    cli = FakeCli()
    eng = ct.Engine("/usr/bin/docker", cli)
    eng.create("vllm", SPEC, str(tmp_path))
    monkeypatch.setattr(ct, "http_ok", lambda url, timeout=3.0: False)
    monkeypatch.setattr(ct, "tcp_ok", lambda hp, timeout=2.0: False)
    clock, sleep = clock_and_sleep()
    with pytest.raises(ct.ContainerError, match=r"cannot reach 10.0.0.99:13389 for 15s"):
        ct.wait_ready(eng, "vllm", "http://x/health", 600, peers=["10.0.0.99:13389"], clock=clock, sleep=sleep)
    monkeypatch.setattr(ct, "tcp_ok", lambda hp, timeout=2.0: True)
    clock, sleep = clock_and_sleep()
    with pytest.raises(ct.ContainerError, match=r"did not answer within 30s"):
        ct.wait_ready(eng, "vllm", "http://x/health", 30, peers=["10.0.0.11:13389"], clock=clock, sleep=sleep)
    monkeypatch.setattr(ct, "http_ok", lambda url, timeout=3.0: True)
    assert ct.wait_ready(eng, "vllm", "http://x/health", 30, clock=clock, sleep=sleep) == 0
    clock, sleep = clock_and_sleep()
    assert ct.wait_ready(eng, "vllm", None, 10, clock=clock, sleep=sleep) >= 10  # stays up for 10 s: fine
