# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.filter import status
from ansible_collections.npuops.ascend.plugins.plugin_utils.model import serve, topology
from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import inventory, rendered


def setup(n=4, instances=1):
    groups, hv = inventory(n * instances)
    if instances > 1:
        for i, h in enumerate(groups["npu_nodes"]):
            hv[h]["npuops_instance"] = "ab"[i // n]
    tier, model, opts = rendered("4node_dp", "kimi_k3_w4a8")
    plan = topology.plan_topology(groups, hv, tier)
    containers = serve.serve_containers(plan, hv, tier, model, opts)
    for h in plan["hosts"]:
        hv[h]["c"] = {"containers": {"vllm": {"exists": True, "running": True, "ours": True, "status": "running"}}}
    return plan, hv, containers


def probe(ok=True, health=True, detail="a token in 0.10s"):
    return {"front": {"ok": ok, "seconds": 0.1, "detail": detail if ok else "no token within 10s", "timed_out": not ok},
            "front_health": {"ok": health, "status": 200 if health else None, "detail": "/health -> 200"},
            "engines": {}}


def test_every_container_up_and_a_token_is_healthy():
    plan, hv, containers = setup()
    got = status.service_status(plan, hv, containers, "c", {"main": probe()})
    assert got["healthy"] and got["state"] == "healthy"
    assert got["instances"]["main"]["state"] == "healthy" and got["instances"]["main"]["problems"] == []


K3_IMAGE = {"id": "sha256:1111", "digest": "sha256:aaaa", "error": None,
            "versions": {"vllm": "0.23.0", "vllm_ascend": "0.23.0", "torch_npu": "2.9.0", "torch": "2.9.0",
                         "cann": "9.1.0"}}


def test_status_names_the_versions_and_digest_each_instance_runs_and_nodes_that_differ():
    plan, hv, containers = setup()
    for h in plan["hosts"]:
        hv[h]["c"]["containers"]["vllm"]["image"] = dict(K3_IMAGE)
    got = status.service_status(plan, hv, containers, "c", {"main": probe()})
    main = got["instances"]["main"]
    assert main["image"] == {"image": "quay.io/ascend/vllm-ascend:v0.23.0-a3", "id": "sha256:1111",
                             "digest": "sha256:aaaa", "versions": K3_IMAGE["versions"]}
    assert sorted(main["images"]) == ["node01", "node02", "node03", "node04"]
    assert main["image_problems"] == [] and main["state"] == "healthy"
    assert got["summary"][0].endswith(
        " [vLLM 0.23.0, vllm-ascend 0.23.0, torch_npu 2.9.0, CANN 9.1.0; sha256:aaaa]"), got["summary"]
    hv["node03"]["c"]["containers"]["vllm"]["image"] = dict(K3_IMAGE, id="sha256:2222", digest="sha256:bbbb")
    main = status.service_status(plan, hv, containers, "c", {"main": probe()})["instances"]["main"]
    assert main["image"] is None and main["image_problems"] == [
        "node03 runs image sha256:bbbb, node01 runs sha256:aaaa: pin one digest in npuops_image "
        "(repository:tag@sha256:...) and deploy again"]
    # an image pulled without a registry digest (built locally) is told apart by its id
    for h in plan["hosts"]:
        hv[h]["c"]["containers"]["vllm"]["image"] = dict(K3_IMAGE, digest=None)
    hv["node02"]["c"]["containers"]["vllm"]["image"] = dict(K3_IMAGE, digest=None, id="sha256:3333")
    main = status.service_status(plan, hv, containers, "c", {"main": probe()})["instances"]["main"]
    assert [p.split(",")[0] for p in main["image_problems"]] == ["node02 runs image sha256:3333"]


def test_a_wedged_engine_answers_health_but_no_token_and_is_down():
    plan, hv, containers = setup()
    got = status.service_status(plan, hv, containers, "c", {"main": probe(ok=False)})
    main = got["instances"]["main"]
    assert not got["healthy"] and main["state"] == "down"
    assert main["reason"] == ("no token within 10s through node01 (http://10.0.0.11:8000) although /health -> 200 "
                              "answers (a wedged engine)")


def test_an_exited_worker_and_an_unreachable_host_are_named():
    plan, hv, containers = setup()
    hv["node03"]["c"] = {"containers": {"vllm": {"exists": True, "running": False, "ours": True, "status": "exited",
                                                 "exit_code": 137, "log": "a\nEngineDeadError: gone\n"}}}
    hv["node04"]["c"] = {"unreachable": True, "msg": "Failed to connect to the host via ssh: timed out"}
    main = status.service_status(plan, hv, containers, "c", {"main": probe(ok=False, health=False)})["instances"]["main"]
    assert main["state"] == "down" and main["problems"] == [
        "node03: container vllm exited (exit code 137); last log line: EngineDeadError: gone",
        "node04: unreachable (Failed to connect to the host via ssh: timed out)"]
    degraded = status.service_status(plan, hv, containers, "c", {"main": probe()})
    assert degraded["instances"]["main"]["state"] == "degraded" and degraded["state"] == "degraded"


def test_with_two_instances_one_down_the_service_is_degraded_and_recover_takes_only_that_one():
    plan, hv, containers = setup(4, 2)
    got = status.service_status(plan, hv, containers, "c", {"a": probe(ok=False), "b": probe()})
    assert got["state"] == "degraded" and not got["healthy"]
    assert [got["instances"][n]["state"] for n in ("a", "b")] == ["down", "healthy"]
    assert status.unhealthy_groups(plan, got) == ["a/main"]
    targets = status.status_probe_targets(plan, "kimi-k3")
    assert [t["url"] for t in targets] == ["http://10.0.0.11:8000", "http://10.0.0.15:8000"]


def test_status_names_the_model_each_instance_serves_and_asks_each_for_its_own():
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model import inventory as inventory_filter
    from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import presets
    groups, hv = inventory(8)
    for i, h in enumerate(groups["npu_nodes"]):
        hv[h].update(npuops_instance="ab"[i // 4], npuops_tier="4node_dp", npuops_model="kimi_k3_w4a8",
                     npuops_model_dir="/data/models/k3" if i < 4 else "/data/models/k3-v2",
                     npuops_image="quay.io/ascend/vllm-ascend:v0.23.0-a3")
        if i >= 4:
            hv[h]["npuops_model_overrides"] = {"served_model_name": "k3-v2"}
    specs = inventory_filter.instance_specs(groups, hv, presets())
    tier, model, opts = rendered("4node_dp", "kimi_k3_w4a8")
    plan = topology.plan_topology(groups, hv, tier, specs)
    containers = serve.serve_containers(plan, hv, tier, model, dict(opts, instances=specs))
    for h in plan["hosts"]:
        hv[h]["c"] = {"containers": {"vllm": {"exists": True, "running": True, "ours": True, "status": "running"}}}
    got = status.service_status(plan, hv, containers, "c", {"a": probe(), "b": probe()})
    assert got["instances"]["b"]["model"] == {"served_model_name": "k3-v2", "preset": "kimi_k3_w4a8",
                                              "model_dir": "/data/models/k3-v2", "recipe": "vllm_ascend_kimi_k3_4node_a3",
                                              "draft": None, "num_speculative_tokens": None}
    assert got["summary"][1].startswith("b: healthy (node05, node06, node07, node08) - a token in 0.10s through ")
    assert got["summary"][1].endswith("; serves k3-v2 from /data/models/k3-v2"), got["summary"]
    assert got["summary"][0].endswith("; serves kimi-k3 from /data/models/k3"), got["summary"]
    assert [t["model"] for t in status.status_probe_targets(plan, "fallback")] == ["kimi-k3", "k3-v2"]


def progress(in_flight, generated, steps, waiting=None):
    waiting = in_flight if waiting is None else waiting
    return {"ok": True, "in_flight": in_flight, "waiting": waiting, "generated": generated, "steps": steps,
            "progressing": generated > 0 or steps > 0,
            "detail": "%d requests in flight (%d waiting), %d tokens and %d engine steps in 5s" % (
                in_flight, waiting, generated, steps)}


def test_a_busy_instance_is_healthy_for_the_exit_code_and_never_restarted():
    """The probe's token waited in the queue past its timeout while the engines stepped: busy, not down. Only an
    instance with requests in flight and nothing moving is down (a wedged engine), and only that one is restarted."""
    plan, hv, containers = setup(instances=2)
    busy = dict(probe(ok=False), progress=progress(48, 1800, 40))
    wedged = dict(probe(ok=False), progress=progress(48, 0, 0))
    got = status.service_status(plan, hv, containers, "c", {"a": busy, "b": probe()})
    assert got["healthy"] and got["state"] == "busy"
    assert got["instances"]["a"]["state"] == "busy"
    assert got["instances"]["a"]["reason"].startswith("busy: 48 requests in flight (48 waiting), 1800 tokens and 40 "
                                                      "engine steps in 5s; no token for the probe within its timeout")
    assert status.unhealthy_groups(plan, got) == []
    got = status.service_status(plan, hv, containers, "c", {"a": busy, "b": wedged})
    assert not got["healthy"] and got["state"] == "degraded"
    assert got["instances"]["b"]["state"] == "down" and "48 requests in flight (48 waiting), 0 tokens and 0 engine " \
        "steps in 5s: no progress" in got["instances"]["b"]["reason"]
    assert status.unhealthy_groups(plan, got) == ["b/main"]
    # an idle engine that gives no token is down whatever its counters say
    idle = dict(probe(ok=False), progress=progress(0, 0, 0))
    assert status.service_status(plan, hv, containers, "c", {"a": idle, "b": probe()})["instances"]["a"]["state"] == \
        "down"


def test_status_reads_every_serving_engines_metrics_beside_the_token_probe():
    plan, _hv, _containers = setup(instances=2)
    targets = status.status_probe_targets(plan, "kimi-k3")
    assert [t["metrics"] for t in targets] == [["http://10.0.0.11:8000"], ["http://10.0.0.15:8000"]]


def recorded(plan, hv, states):
    """Each instance's record on its first host ({instance: (config, gate state)}), as instance_verdict reads it, and
    the containers' specs that make those configurations."""
    from ansible_collections.npuops.ascend.plugins.module_utils import verdict
    for h in plan["hosts"]:
        hv[h]["c"]["containers"]["vllm"]["spec"] = {"command": ["vllm", "serve", h], "image": "i"}
    configs = status.instance_configs(plan, hv, _containers(plan, hv), "c")
    for name, state in states.items():
        doc = None
        if state in (verdict.PASSED, verdict.FAILED):
            doc = verdict.record(None, name, configs[name]["config"], "answers", state, "golden 0.00" if state ==
                                 verdict.FAILED else "golden 100.0", "t1")
        hv[status.verdict_hosts(plan)[name]]["v"] = {"record": doc or verdict.empty(name)}
    return configs


def _containers(plan, hv):
    from ansible_collections.npuops.ascend.plugins.plugin_utils.model import serve as serve_filter
    tier, model, opts = rendered("4node_dp", "kimi_k3_w4a8")
    return serve_filter.serve_containers(plan, hv, tier, model, opts)


def test_an_instance_that_answers_while_its_configuration_failed_its_gate_is_wrong_and_not_restarted():
    plan, hv, containers = setup(instances=2)
    configs = recorded(plan, hv, {"a": "failed", "b": "passed"})
    assert configs["a"]["config"] != configs["b"]["config"] and configs["a"]["config"].startswith("cfg-")
    assert configs["a"]["engines"]["node02"] == {
        "vllm": {"exists": True, "spec": {"command": ["vllm", "serve", "node02"], "image": "i"}}}
    gates = status.gate_states(configs, hv, "v", ["answers"], plan)
    assert gates["a"]["state"] == "failed" and gates["b"]["state"] == "passed"
    got = status.service_status(plan, hv, containers, "c", {"a": probe(), "b": probe()}, gates=gates)
    assert not got["healthy"] and got["state"] == "degraded"
    assert got["instances"]["a"]["state"] == "wrong"
    assert got["instances"]["a"]["reason"].startswith("answers wrongly: its running configuration (cfg-")
    assert got["instances"]["a"]["reason"].endswith("failed the answers gate at t1: golden 0.00")
    assert got["summary"][1].startswith("b: healthy (node05, node06, node07, node08) - a token in 0.10s through ")
    assert "; answers passed" in got["summary"][1]
    assert status.unhealthy_groups(plan, got) == []  # a restart would not change what it answers
    # down stays down whatever its verdict; all wrong: the service is wrong
    got = status.service_status(plan, hv, containers, "c", {"a": probe(ok=False), "b": probe()}, gates=gates)
    assert got["instances"]["a"]["state"] == "down" and status.unhealthy_groups(plan, got) == ["a/main"]
    both = dict(gates, b=dict(gates["a"]))
    assert status.service_status(plan, hv, containers, "c", {"a": probe(), "b": probe()}, gates=both)["state"] == \
        "wrong"
    # never measured (the stage skipped): said, not held against it
    recorded(plan, hv, {"a": "not measured", "b": "passed"})
    gates = status.gate_states(configs, hv, "v", ["answers"], plan)
    got = status.service_status(plan, hv, containers, "c", {"a": probe(), "b": probe()}, gates=gates)
    assert got["healthy"] and "; answers not measured" in got["summary"][0]
    # a record that could not be read is named, and counts as never measured
    hv["node01"]["v"] = {"failed": True, "msg": "instance a: /var/lib/npuops/verdicts/a.json is not a verdict record"}
    gates = status.gate_states(configs, hv, "v", ["answers"], plan)
    assert gates["a"]["state"] == "not measured" and gates["a"]["detail"] == (
        "its verdicts on node01 could not be read (instance a: /var/lib/npuops/verdicts/a.json is not a verdict "
        "record)")


def test_one_decision_puts_an_instance_into_rotation_on_every_path():
    """may serve: alive, and its running configuration passed every gate asked. Out of rotation and not proven: measured
    first where the path measures, else left out with why; in rotation and failed: taken out."""
    def state(s):
        return {"state": s, "detail": "because %s" % s}
    states = {"a": state("passed"), "b": state("failed"), "c": state("not measured"), "d": state("unknown"),
              "e": state("failed"), "f": state("not measured"), "g": state("passed")}
    rotation = {"a": "out", "b": "out", "c": "out", "d": "out", "e": "in", "f": "in", "g": "out"}
    got = status.rotation_decisions(rotation, states, measure=True, alive={"g": False})
    assert got["back"] == ["a"] and got["out"] == ["e"] and got["measure"] == ["b", "c", "d"]
    assert got["kept_out"] == {"e": "because failed", "g": "it is down"}
    assert got["lines"] == ["a: back into rotation (because passed)", "e: out of rotation: because failed",
                            "b: measured before it may serve (because failed)",
                            "c: measured before it may serve (because not measured)",
                            "d: measured before it may serve (because unknown)", "g: stays out of rotation: it is down"]
    got = status.rotation_decisions(rotation, states)
    assert got["measure"] == [] and got["back"] == ["a", "g"]
    assert got["kept_out"]["c"] == "because not measured" and got["kept_out"]["b"] == "because failed"
    assert status.rotation_decisions({"a": "unknown"}, {"a": state("failed")})["out"] == []
    assert status.may_serve("passed") and not status.may_serve("passed", alive=False)
    assert not any(status.may_serve(s) for s in ("failed", "not measured", "unknown"))


def test_what_a_measurement_proves_puts_back_or_keeps_out_with_the_gates_words():
    decided = status.rotation_decisions({"a": "out", "b": "out", "c": "out"},
                                        {n: {"state": "not measured", "detail": "never"} for n in "abc"}, measure=True)
    measured = {"instances": {"a": {"ok": True, "summary": "golden 100.0"},
                              "b": {"ok": False, "summary": "golden score 0.00 is outside"}}}
    got = status.rotation_measured(decided, measured)
    assert got["back"] == ["a"] and got["measure"] == []
    assert got["kept_out"] == {"b": "measured now: golden score 0.00 is outside", "c": "measured now: not measured"}
    assert got["lines"][-3:] == ["a: measured now, back into rotation (golden 100.0)",
                                 "b: stays out of rotation: measured now: golden score 0.00 is outside",
                                 "c: stays out of rotation: measured now: not measured"]


def test_an_instance_left_on_a_configuration_that_answers_wrongly_gets_the_last_that_passed():
    plan, hv, _containers = setup(instances=2)
    good = {"config": "cfg-good", "engines": {"node01": {"vllm": {"exists": True, "spec": {"command": ["g"]}}}},
            "why": "the last configuration that passed its gates (cfg-good, at t1)"}
    states = {"a": {"state": "not measured", "detail": "never", "config": "cfg-new", "last_good": good},
              "b": {"state": "passed", "detail": "ok", "config": "cfg-b", "last_good": None}}
    decided = status.rotation_decisions({"a": "out", "b": "in"}, states, measure=True)
    assert decided["measure"] == ["a"] and decided["wrong"] == []
    got = status.rotation_measured(decided, {"instances": {"a": {"ok": False, "judged": True,
                                                                 "summary": "golden score 0.00 is outside"}}})
    assert got["wrong"] == ["a: measured now: golden score 0.00 is outside"]
    assert got["states"]["a"]["state"] == "failed"
    restores = status.rotation_restores(got, plan)
    assert restores == [{"instance": "a", "groups": ["a/main"], "hosts": ["node01", "node02", "node03", "node04"],
                         "restore": good}]
    # not judged (it did not answer): no verdict, so nothing is restored; it stays out
    got = status.rotation_measured(decided, {"instances": {"a": {"ok": False, "judged": False, "summary": "timeout"}}})
    assert status.rotation_restores(got, plan) == [] and got["wrong"] == [] and "a" in got["kept_out"]
    # the last that passed is what runs: nothing to restore
    same = dict(states, a=dict(states["a"], config="cfg-good"))
    got = status.rotation_measured(status.rotation_decisions({"a": "out"}, same, measure=True),
                                   {"instances": {"a": {"ok": False, "judged": True, "summary": "wrong"}}})
    assert status.rotation_restores(got, plan) == []
