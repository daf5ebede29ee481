"""docs/monitoring.md keeps up with the shipped alert rules: every alert has its entry (meaning, first action)."""
import os
import re

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RULES = os.path.join(REPO, "collections/ansible_collections/npuops/ascend/roles/monitoring/files/npuops-alerts.rules.yml")


def test_every_alert_has_a_runbook_entry_with_a_first_action():
    with open(RULES) as f:
        alerts = [r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"] if "alert" in r]
    with open(os.path.join(REPO, "docs", "monitoring.md")) as f:
        doc = f.read()
    assert len(alerts) == 16
    for name in alerts:
        m = re.search(r"^### %s\n(.*?)(?=^### |\Z)" % name, doc, re.S | re.M)
        assert m, name
        assert "First action:" in m.group(1), name
