# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import container as ct
from ansible_collections.npuops.ascend.plugins.module_utils import proc

COMMAND = ["vllm", "serve", "/m", "--max-num-seqs", "16", "--enable-expert-parallel"]
SPEC = {"image": "quay.io/ascend/vllm-ascend:v0.23.0-a3", "command": COMMAND,
        "env": {"A": "1", "HCCL_BUFFSIZE": "256"}, "secret_env": {"VLLM_API_KEY": "hunter2"},
        "devices": ["/dev/davinci0"], "mounts": ["/etc/hccn.conf:/etc/hccn.conf:ro"], "shm_size": "16g",
        "network": "host", "privileged": False, "labels": {"io.npuops.role": "leader"}, "restart_policy": None}


class FakeCli(object):
    """A container CLI over an in-memory table of containers, recording every call (argv, stdin)."""

    def __init__(self):
        self.containers = {}
        self.secrets = {}
        self.calls = []
        self.logs = "line1\nline2"
        self.hang = None
        self.started = 0

    def __call__(self, argv, timeout, data=None):
        self.calls.append((argv, data))
        verb = argv[1]
        if self.hang == verb:
            return proc.TIMED_OUT, "", "(killed after %ss)" % timeout
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
            self.started += 1
            self.containers[name] = {"Id": "c0ffee%d" % self.started, "State": {
                "Running": True, "ExitCode": 0, "StartedAt": "t%d" % self.started, "Pid": 4242},
                "Config": {"Labels": labels}}
            return 0, "c0ffee\n", ""
        if verb == "rm":
            self.containers.pop(argv[-1], None)
            return 0, "", ""
        if verb == "stop":
            self.containers[argv[-1]]["State"]["Running"] = False
            return 0, "", ""
        if verb == "start":
            self.started += 1
            self.containers[argv[-1]]["State"].update(Running=True, StartedAt="t%d" % self.started)
            return 0, "", ""
        if verb == "logs":
            return 0, self.logs, ""
        if verb == "secret":
            if argv[2] == "create":
                self.secrets[argv[3]] = data
            else:
                self.secrets.pop(argv[3], None)
            return 0, "", ""
        return 1, "", "unknown verb"


def engine(cli_name="docker", cli=None):
    cli = cli or FakeCli()
    return ct.Engine("/usr/bin/" + cli_name, cli), cli


def converge(eng, tmp_path, spec=None, state="started", **kw):
    return ct.converge(eng, "vllm", spec or SPEC, state, secret_dir=str(tmp_path / "run"),
                       key_path=str(tmp_path / "key" / "digest.key"), **kw)


@pytest.mark.parametrize("current,state,recreate,action", [
    (None, "started", False, "create"),
    ({"hash": "h", "running": True}, "started", False, "none"),
    ({"hash": "old", "running": True}, "started", False, "recreate"),
    ({"hash": "h", "running": True}, "started", True, "recreate"),
    ({"hash": "h", "running": False}, "started", False, "start"),
    ({"hash": "old", "running": False}, "started", False, "recreate"),
    ({"hash": "h", "running": True}, "stopped", False, "stop"),
    ({"hash": "h", "running": False}, "stopped", False, "none"),
    (None, "stopped", False, "none"),
    ({"hash": "h", "running": False}, "absent", False, "remove"),
    (None, "absent", False, "none"),
    ({"hash": "h", "running": True}, "ready", False, "none"),
])
def test_every_transition_of_the_state_machine(current, state, recreate, action):
    assert ct.transition(current, state, "h", recreate) == action


def test_create_then_nothing_then_recreate_on_change_with_every_change_named(tmp_path):
    eng, cli = engine()
    first = converge(eng, tmp_path)
    assert first["action"] == "create" and first["changed"] and first["started_at"] == "t1"
    assert converge(eng, tmp_path)["action"] == "none" and len(cli.containers) == 1
    changed = dict(SPEC, command=["8" if a == "16" else a for a in SPEC["command"]], env={"A": "1", "HCCL_BUFFSIZE": "512"},
                   devices=["/dev/davinci0", "/dev/davinci1"])
    res = converge(eng, tmp_path, changed)
    assert res["action"] == "recreate" and res["started_at"] == "t2"
    assert res["changes"] == ["--max-num-seqs: 16 -> 8", "env HCCL_BUFFSIZE: 256 -> 512", "devices +/dev/davinci1"]
    assert res["changed_fields"] == ["command", "devices", "env"]
    assert res["diff"]["before"]["command"]["--max-num-seqs"] == "16"
    assert res["diff"]["after"]["command"] == {"program": "vllm serve /m", "--max-num-seqs": "8",
                                               "--enable-expert-parallel": True}


def test_a_stopped_container_is_started_and_a_running_one_stopped_and_removed(tmp_path):
    eng, cli = engine()
    converge(eng, tmp_path)
    assert converge(eng, tmp_path, state="stopped")["action"] == "stop"
    assert converge(eng, tmp_path, state="stopped")["action"] == "none"
    res = converge(eng, tmp_path)
    assert res["action"] == "start" and res["started_at"] == "t2" and res["changes"] == []
    assert converge(eng, tmp_path, state="absent")["action"] == "remove" and cli.containers == {}
    assert converge(eng, tmp_path, state="absent")["action"] == "none"


@pytest.mark.parametrize("state,verb", [("started", "replace"), ("stopped", "stop"), ("absent", "remove")])
def test_a_container_npuops_did_not_make_is_refused_named_and_left_alone(tmp_path, state, verb):
    """The ownership rule: an operator's own container named vllm (no config label) is never replaced, stopped or
    removed, in check mode neither, unless takeover."""
    eng, cli = engine()
    cli.containers["vllm"] = {"Id": "beef", "State": {"Running": True, "Status": "running", "ExitCode": 0,
                                                      "StartedAt": "t0", "Pid": 7},
                              "Config": {"Labels": {"maintainer": "ops"}, "Image": "docker.io/library/nginx:1"}}
    before = json.dumps(cli.containers)
    for check_mode in (True, False):
        with pytest.raises(ct.ContainerError) as err:
            converge(eng, tmp_path, state=state, check_mode=check_mode)
        assert str(err.value) == (
            "a container named vllm that npuops did not make is here (image docker.io/library/nginx:1, running); "
            "npuops does not %s it. Remove or rename it, or set npuops_takeover: true to let npuops %s it"
            % (verb, verb))
    assert json.dumps(cli.containers) == before and not any(c[0][1] in ("run", "rm", "stop") for c in cli.calls)
    assert ct.describe_container(eng, "vllm")["ours"] is False
    res = converge(eng, tmp_path, state=state, takeover=True)
    assert res["changed"] and res["action"] == {"started": "recreate", "stopped": "stop", "absent": "remove"}[state]


def test_check_mode_reports_and_does_nothing_even_for_a_container_that_does_not_exist(tmp_path):
    eng, cli = engine()
    res = converge(eng, tmp_path, check_mode=True)
    assert res["action"] == "create" and res["changed"] and res["changes"] == ["(all): (unset) -> created"]
    assert res["diff"]["before"] == {} and res["diff"]["after"]["image"] == SPEC["image"]
    assert cli.containers == {} and not any(c[0][1] in ("run", "secret") for c in cli.calls)
    waited = []
    res = converge(eng, tmp_path, state="ready", check_mode=True, wait={"url": "http://x/health", "timeout": 600},
                   waiter=lambda *a, **k: waited.append(a))
    assert res["changed"] is False and "not waiting" in res["msg"] and waited == []
    with pytest.raises(ct.ContainerError, match="no such container"):
        converge(eng, tmp_path, state="ready")


def test_ready_waits_for_an_existing_container_and_fails_with_this_runs_log(tmp_path):
    eng, cli = engine()
    converge(eng, tmp_path)
    res = converge(eng, tmp_path, state="ready", wait={"url": "http://x/health", "timeout": 60},
                   waiter=lambda *a, **k: 1.5)
    assert res["ready_after"] == 1.5 and not res["changed"]
    cli.containers["vllm"]["State"].update(Running=False, ExitCode=3)
    with pytest.raises(ct.ContainerError, match=r"(?s)exited with code 3.*line2") as e:
        converge(eng, tmp_path, state="ready")
    assert e.value.extra["exit_code"] == 3
    logs = [c[0] for c in cli.calls if c[0][1] == "logs"][-1]
    assert logs[logs.index("--since") + 1] == "t1"  # only the lines of this start


def test_secrets_reach_no_argv_and_labels_carry_only_a_keyed_digest(tmp_path):
    eng, cli = engine("docker")
    converge(eng, tmp_path)
    run = [c[0] for c in cli.calls if c[0][1] == "run"][0]
    assert "hunter2" not in " ".join(run)
    env_file, content, mode = cli.env_file_seen
    assert content == "VLLM_API_KEY=hunter2\n" and mode == "0o600" and not os.path.exists(env_file)
    labels = cli.containers["vllm"]["Config"]["Labels"]
    spec = ct.Engine.state(cli.containers["vllm"])["spec"]
    digest = spec["secret_env"]["VLLM_API_KEY"]
    assert digest.startswith("hmac-sha256:")
    import hashlib
    plain = hashlib.sha256(b"hunter2").hexdigest()
    assert plain[:16] not in json.dumps(labels) and plain[:16] not in digest
    assert oct(os.stat(str(tmp_path / "key" / "digest.key")).st_mode & 0o777) == "0o600"
    res = converge(eng, tmp_path, dict(SPEC, secret_env={"VLLM_API_KEY": "new"}))
    assert res["action"] == "recreate" and res["changes"] == ["secret_env VLLM_API_KEY: (secret) -> (secret)"]
    assert "new" not in json.dumps(res["diff"]) and "hunter2" not in json.dumps(res["diff"])


def test_podman_passes_secrets_through_its_secret_store(tmp_path):
    eng, cli = engine("podman")
    converge(eng, tmp_path)
    run = [c[0] for c in cli.calls if c[0][1] == "run"][0]
    assert "--env-file" not in run and "hunter2" not in " ".join(run)
    assert run[run.index("--secret") + 1] == "npuops-vllm-vllm-api-key,type=mount,target=VLLM_API_KEY"
    assert cli.secrets == {"npuops-vllm-vllm-api-key": "hunter2"}  # given on stdin, never argv
    # the command exports the mounted file, then execs the real command: inspect shows names, never the value
    tail = run[run.index(SPEC["image"]) + 1:]
    assert tail[:4] == ["/bin/sh", "-c", 'export VLLM_API_KEY="$(cat /run/secrets/VLLM_API_KEY)"; exec "$@"',
                        "npuops-secrets"] and ct.unwrapped(tail) == SPEC["command"]
    converge(eng, tmp_path, state="absent")
    assert cli.secrets == {}


def test_a_wedged_cli_fails_the_call_naming_it(tmp_path):
    eng, cli = engine()
    cli.hang = "inspect"
    with pytest.raises(ct.ContainerError, match=r"/usr/bin/docker inspect --type container did not answer within 60s"):
        converge(eng, tmp_path)


def test_isula_inspect_has_no_type_flag(tmp_path):
    eng, cli = engine("isula")
    converge(eng, tmp_path)
    assert [c[0][1:3] for c in cli.calls if c[0][1] == "inspect"][0] == ["inspect", "vllm"]


def test_argv_flags_reads_values_lists_and_switches():
    program, flags = ct.argv_flags(["python3", "proxy.py", "--port", "8080", "--prefiller-hosts", "a", "b",
                                    "--prefiller-ports", "1", "2", "--verbose"])
    assert program == "python3 proxy.py"
    assert flags == {"--port": "8080", "--prefiller-hosts": "a b", "--prefiller-ports": "1 2", "--verbose": True}


def test_run_argv_carries_every_managed_field():
    argv = ct.Engine("/usr/bin/docker", FakeCli()).run_argv("vllm", SPEC, key=b"k", env_file="/run/x.env")
    joined = " ".join(argv)
    for part in ("--net host", "--shm-size 16g", "--device /dev/davinci0", "-v /etc/hccn.conf:/etc/hccn.conf:ro",
                 "-e A=1", "--label io.npuops.role=leader", "--env-file /run/x.env"):
        assert part in joined
    assert argv[-7:] == [SPEC["image"]] + SPEC["command"]


def clock_and_sleep():
    now = [0.0]
    return (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))


def test_wait_ready_fails_fast_when_the_container_exits(tmp_path):
    eng, cli = engine()
    converge(eng, tmp_path)
    cli.containers["vllm"]["State"].update(Running=False, ExitCode=1)
    clock, sleep = clock_and_sleep()
    with pytest.raises(ct.ContainerError, match=r"(?s)exited with code 1 before http://x/health answered.*line2") as e:
        ct.wait_ready(eng, "vllm", "http://x/health", 600, clock=clock, sleep=sleep)
    assert e.value.extra["exit_code"] == 1


def test_wait_ready_names_an_unreachable_peer_and_respects_the_timeout(tmp_path, monkeypatch):
    eng, cli = engine()
    converge(eng, tmp_path)
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


def test_proc_run_kills_a_command_that_hangs_and_its_children():
    import time
    t0 = time.time()
    rc, _out, err = proc.run(["sh", "-c", "sleep 30 & sleep 30"], timeout=1)
    assert rc == proc.TIMED_OUT and "killed after 1s" in err and time.time() - t0 < 5
    assert proc.run(["sh", "-c", "cat; echo err >&2"], 5, data="in") == (0, "in", "err\n")
    assert proc.run(["/nonexistent/tool"], 5)[0] == 127


def test_a_sliced_wait_carries_the_peer_count_from_slice_to_slice(tmp_path, monkeypatch):
    eng, cli = engine()
    converge(eng, tmp_path)
    monkeypatch.setattr(ct, "http_ok", lambda url, timeout=3.0: False)
    monkeypatch.setattr(ct, "tcp_ok", lambda hp, timeout=2.0: False)
    clock, sleep = clock_and_sleep()
    with pytest.raises(ct.ContainerError, match="did not answer within 10s") as first:
        ct.wait_ready(eng, "vllm", "http://x/health", 10, peers=["10.0.0.11:13389"], clock=clock, sleep=sleep)
    assert first.value.extra["timed_out"] and first.value.extra["missed"]["10.0.0.11:13389"] >= 10
    clock, sleep = clock_and_sleep()
    with pytest.raises(ct.ContainerError, match="cannot reach 10.0.0.11:13389 for 15s"):
        ct.wait_ready(eng, "vllm", "http://x/health", 10, peers=["10.0.0.11:13389"], clock=clock, sleep=sleep,
                      missed=first.value.extra["missed"])


def test_an_optional_mount_is_left_out_only_where_its_source_is_missing(tmp_path):
    present = tmp_path / "hccn.conf"
    present.write_text("address_0=10.0.0.1\n")
    mounts = ["/srv/models:/srv/models:ro", "%s:/etc/hccn.conf:ro" % present, "/etc/absent.conf:/etc/absent.conf:ro",
              "/etc/required.conf:/etc/required.conf:ro"]
    kept, missing = ct.present_mounts(mounts, [str(present), "/etc/absent.conf"])
    # a missing source that is not optional stays: the start then fails naming it, as it must
    assert kept == ["/srv/models:/srv/models:ro", "%s:/etc/hccn.conf:ro" % present,
                    "/etc/required.conf:/etc/required.conf:ro"]
    assert missing == ["/etc/absent.conf"]
    assert ct.present_mounts(mounts, []) == (mounts, [])


def test_status_reads_the_image_of_a_running_container_only(tmp_path):
    """describe_container hands the running container's image id (inspect's Image) to read_image, so what status
    reports is the image the engine runs, not the one the inventory names."""
    eng, cli = engine()
    converge(eng, tmp_path)
    cli.containers["vllm"]["Image"] = "sha256:9a1f"
    asked = []
    got = ct.describe_container(eng, "vllm", read_image=lambda i: asked.append(i) or {"id": i, "digest": "sha256:4c2e"})
    assert asked == ["sha256:9a1f"] and got["image"] == {"id": "sha256:9a1f", "digest": "sha256:4c2e"}
    assert "image" not in ct.describe_container(eng, "vllm")  # not asked for: nothing read
    cli.containers["vllm"]["State"]["Running"] = False
    got = ct.describe_container(eng, "vllm", read_image=asked.append)
    assert "image" not in got and asked == ["sha256:9a1f"] and got["log"] == "line1\nline2"


def test_flag_words_reads_a_flags_words_up_to_the_next_flag():
    argv = ["vllm", "serve", "/m", "--served-model-name", "k3-v2", "kimi-k3", "--speculative-config", '{"k": 7}',
            "--headless"]
    assert ct.flag_words(argv, "--served-model-name") == ["k3-v2", "kimi-k3"]
    assert ct.flag_words(argv, "--speculative-config") == ['{"k": 7}']
    assert ct.flag_words(argv, "--headless") == [] and ct.flag_words(argv, "--port") == []


def test_every_place_that_lists_the_container_engines_lists_container_engines():
    """The engines are stated once (container.ENGINES); the YAML that cannot import it - module documentation, the
    doc fragment, the plan role's argument spec - must list the same, in the same order."""
    import glob
    import importlib

    import yaml
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    listed = {}
    for path in sorted(glob.glob(os.path.join(root, "plugins", "modules", "*.py"))):
        name = os.path.basename(path)[:-3]
        doc = yaml.safe_load(importlib.import_module("ansible_collections.npuops.ascend.plugins.modules." + name)
                             .DOCUMENTATION)
        for option in ("engine", "container_engine"):
            if "choices" in (doc.get("options") or {}).get(option, {}):
                listed["module %s: %s" % (name, option)] = doc["options"][option]["choices"]
    fragment = importlib.import_module("ansible_collections.npuops.ascend.plugins.doc_fragments.container_engine")
    listed["doc fragment container_engine"] = yaml.safe_load(fragment.ModuleDocFragment.DOCUMENTATION)[
        "options"]["engine"]["choices"]
    with open(os.path.join(root, "roles", "plan", "meta", "argument_specs.yml")) as f:
        specs = yaml.safe_load(f)["argument_specs"]
    for entry, spec in specs.items():
        option = spec.get("options", {}).get("npuops_container_engine")
        if option and "choices" in option:
            listed["plan role %s: npuops_container_engine" % entry] = option["choices"]
    assert len(listed) >= 4, listed  # the fragment, host_check, npu_exporter, the plan role at least
    assert {where: choices for where, choices in listed.items() if choices != list(ct.ENGINES)} == {}
