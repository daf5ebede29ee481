"""docs/diagnose.md is what the diagnosis' data and its corpus say (tools/render_diagnose_doc.py writes it)."""
import os
import subprocess
import sys

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def test_the_diagnose_document_lists_every_signature_with_its_source():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "render_diagnose_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(os.path.join(REPO, "docs", "diagnose.md")) as f:
        doc = f.read()
    with open(os.path.join(REPO, "collections/ansible_collections/npuops/ascend/data/diagnose/signatures.yml")) as f:
        items = yaml.safe_load(f)["signatures"]
    for s in items:
        assert "### `%s` - %s" % (s["id"], s["cause"]) in doc and s["source"] in doc, s["id"]
    assert "python -m ansible_collections.npuops.ascend.plugins.module_utils.diagnose" in doc
    with open(os.path.join(REPO, "collections/ansible_collections/npuops/ascend/data/diagnose/codes.yml")) as f:
        families = yaml.safe_load(f)["families"]
    for fam in families:
        assert "### `%s`" % fam["id"] in doc and fam["source"] in doc, fam["id"]
        for row in fam.get("rows") or []:
            assert "| `%s`" % row["code"] in doc, (fam["id"], row["code"])


def test_the_diagnose_document_gives_the_first_score_of_the_excerpts_collected_last_beside_today_s():
    with open(os.path.join(REPO, "collections/ansible_collections/npuops/ascend/tests/unit/plugins/module_utils/"
                                 "fixtures/diagnose/measurement.yml")) as f:
        first = yaml.safe_load(f)["first_score_last"]
    with open(os.path.join(REPO, "docs", "diagnose.md")) as f:
        doc = f.read()
    assert "first score: %d of %d" % (first["right"], first["of"]) in doc
    assert "at commit %s" % first["commit"] in doc and "); today: " in doc
