# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.npuops.ascend.plugins.module_utils import probe
from ansible_collections.npuops.ascend.plugins.module_utils.openai_client import Client
from ansible_collections.npuops.ascend.tests.unit.plugins.module_utils.test_status_probe import server


def test_a_frozen_service_fails_the_checks_within_the_budget_not_one_timeout_per_check():
    srv, url = server(wedged=True)  # /health answers, completions never do
    try:
        t0 = time.time()
        rows, _model = probe.run_checks(Client(url, timeout=30), model="m", budget=4)
        took = time.time() - t0
    finally:
        srv.shutdown()
    assert took < 8, took  # without the budget: 30 s for each of six request checks
    by_name = dict((r["name"], r) for r in rows)
    assert by_name["health"]["ok"] and not by_name["chat"]["ok"]
    assert any(r["detail"].startswith("not run: the checks' budget of 4s was spent") for r in rows)
    assert [r["name"] for r in rows] == list(probe.ALL)  # every check has its row
