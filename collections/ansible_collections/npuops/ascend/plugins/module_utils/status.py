# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is the service answering? Bounded probes of every instance's front door and every serving engine.

`/health` 200 proves little: an engine whose collective hangs on the NPUs keeps answering it while no token
comes out. So each instance gets a one-token completion through its front door, each serving engine a `/health`,
all of them at once and each within its own timeout, so one status of a cluster takes about one timeout
whatever is broken. Standard library (and ansible's open_url) only: this may run on a node.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.npuops.ascend.plugins.module_utils import workers
from ansible_collections.npuops.ascend.plugins.module_utils.engine_progress import (
    GENERATED, PROGRESS_METRICS, RUNNING, STEPS, WAITING, one_token_request, token_came)
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import ApiError, Client, engines_totals

# seconds between the two readings of an instance's counters (at most the token probe's timeout)
PROGRESS_WINDOW = 5.0


def one_token(url, model, api_key=None, timeout=10.0):
    """A one-token completion: -> {ok, seconds, detail, timed_out} (timed_out: nothing came within `timeout`, which a
    busy engine's queue also causes)."""
    t0 = time.time()
    client = Client(url, api_key=api_key, timeout=timeout)
    try:
        resp, _s = client.post("/v1/completions", one_token_request(model))
        ok = token_came(resp)
        detail = "a token in %.2fs" % (time.time() - t0) if ok else "an answer without a token: %s" % str(resp)[:200]
    except ApiError as e:
        ok, detail = False, _why(e, timeout, time.time() - t0)
    return {"ok": ok, "seconds": round(time.time() - t0, 2), "detail": detail,
            "timed_out": not ok and detail == TIMED_OUT % timeout}


def health(url, path, timeout=3.0):
    """GET `path`: -> {ok, status, seconds, detail}."""
    t0 = time.time()
    status, text, _s = Client(url, timeout=timeout).get(path)
    took = time.time() - t0
    if status is None:
        detail = "no answer within %ds" % timeout if took >= timeout - 0.5 or "timed out" in text else text[:200]
    else:
        detail = "%s -> %s" % (path, status)
    return {"ok": status == 200, "status": status, "seconds": round(took, 2), "detail": detail}


def _metrics(urls, timeout):
    return engines_totals([Client(url, timeout=timeout) for url in urls], PROGRESS_METRICS)


def progress(urls, window, timeout=3.0):
    """Two readings of the serving engines' /metrics `window` seconds apart (the API server answers them without
    queueing behind the load): -> {ok, in_flight, waiting, generated, steps, progressing, detail}; ok False when an
    engine has no metrics."""
    first = _metrics(urls, timeout)
    if first is None or not urls:
        return {"ok": False, "progressing": False, "detail": "no metrics"}
    time.sleep(window)
    second = _metrics(urls, timeout)
    if second is None:
        return {"ok": False, "progressing": False, "detail": "no metrics"}
    generated, steps = second[GENERATED] - first[GENERATED], second[STEPS] - first[STEPS]
    running, waiting = second[RUNNING], second[WAITING]
    return {"ok": True, "in_flight": int(running + waiting), "waiting": int(waiting), "generated": int(generated),
            "steps": int(steps), "progressing": generated > 0 or steps > 0,
            "detail": "%d requests in flight (%d waiting), %d tokens and %d engine steps in %ds" % (
                running + waiting, waiting, generated, steps, window)}


TIMED_OUT = "no token within %ds"


def _why(error, timeout, took):
    text = str(error)
    if error.status is None and (took >= timeout - 0.5 or "timed out" in text):
        return TIMED_OUT % timeout
    return text[:300]


def probe_all(instances, api_key=None, token_timeout=10.0, health_timeout=3.0, parallel=32):
    """`instances`: [{name, url, model, health_path, engines: [url, ...], metrics: [url, ...]}] -> {name: {front,
    front_health, engines, progress}}.

    Every probe runs at once (up to `parallel` threads), each bounded by its own timeout."""
    jobs = []
    for inst in instances:
        jobs.append((inst["name"], "front", inst["url"], lambda i=inst: one_token(i["url"], i["model"], api_key,
                                                                                  token_timeout)))
        jobs.append((inst["name"], "front_health", inst["url"],
                     lambda i=inst: health(i["url"], i.get("health_path") or "/health", health_timeout)))
        for url in inst.get("engines") or []:
            jobs.append((inst["name"], "engine", url, lambda u=url: health(u, "/health", health_timeout)))
        if inst.get("metrics"):
            # beside the token probe: a busy engine's token waits in its queue, its counters still move
            jobs.append((inst["name"], "progress", inst["url"],
                         lambda i=inst: progress(i["metrics"], min(PROGRESS_WINDOW, token_timeout), health_timeout)))
    results = workers.for_each(jobs, lambda job: job[3](), parallel)
    out = dict((inst["name"], {"front": None, "front_health": None, "engines": {}, "progress": None})
               for inst in instances)
    for (name, kind, url, _fn), res in zip(jobs, results):
        if kind == "engine":
            out[name]["engines"][url] = res
        else:
            out[name][kind] = res
    return out
