"""The collection as Galaxy and an execution environment see it: its README names every module and role, and
ansible-builder finds its controller-side Python and system dependencies (the collection stage of make test runs
Galaxy's importer on the built tarball)."""
import importlib
import importlib.util
import os
import re
import subprocess

import yaml

from npuops_sim.testing import BIN, REPO

COLLECTION = os.path.join(REPO, "collections", "ansible_collections", "npuops", "ascend")


def test_the_collection_readme_names_every_module_and_role():
    with open(os.path.join(COLLECTION, "README.md")) as f:
        readme = f.read()
    named = set(re.findall(r"`([a-z_]+)`", readme))
    modules = {f[:-3] for f in os.listdir(os.path.join(COLLECTION, "plugins", "modules"))
               if f.endswith(".py") and f != "__init__.py"}
    roles = {d for d in os.listdir(os.path.join(COLLECTION, "roles"))
             if os.path.isdir(os.path.join(COLLECTION, "roles", d))}
    assert modules and roles
    assert sorted(modules - named) == [] and sorted(roles - named) == []


def test_ansible_builder_finds_the_collections_python_and_system_dependencies():
    proc = subprocess.run([os.path.join(BIN, "ansible-builder"), "introspect", os.path.join(REPO, "collections")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert re.search(r"matplotlib[^\n]*# from collection npuops\.ascend", out), out
    assert re.search(r"openssh-client \[platform:dpkg\][^\n]*# from collection npuops\.ascend", out), out


def test_every_filter_has_its_documentation():
    """Galaxy's importer runs ansible-doc over every filter a FilterModule exports and refuses the collection when
    one has no documentation (ansible-test sanity does not look at filters kept together in one file)."""
    filter_dir = os.path.join(COLLECTION, "plugins", "filter")
    exported = {}
    for name in sorted(os.listdir(filter_dir)):
        if name.endswith(".py") and name != "__init__.py":
            module = importlib.import_module("ansible_collections.npuops.ascend.plugins.filter." + name[:-3])
            exported.update((filter_name, name) for filter_name in module.FilterModule().filters())
    assert len(exported) > 50
    undocumented, misnamed = [], []
    for filter_name, source in sorted(exported.items()):
        doc_path = os.path.join(filter_dir, filter_name + ".yml")
        if not os.path.exists(doc_path):
            undocumented.append("%s (%s)" % (filter_name, source))
            continue
        with open(doc_path) as f:
            doc = yaml.safe_load(f)
        if (doc.get("DOCUMENTATION") or {}).get("name") != filter_name or "RETURN" not in doc:
            misnamed.append(filter_name)
    assert undocumented == [] and misnamed == []


def test_every_sim_test_file_has_its_seconds_in_the_lane_order():
    """A sim test file missing from conftest.FILE_SECONDS runs after every listed one: a long one started last keeps
    its lane running while the others idle (test_answers_gate.py and test_pd_4p4d.py did, for minutes)."""
    spec = importlib.util.spec_from_file_location("npuops_root_conftest", os.path.join(REPO, "conftest.py"))
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    sim_files = []
    for directory in ("tests", os.path.join("sim", "tests")):
        for name in sorted(os.listdir(os.path.join(REPO, directory))):
            if name.startswith("test_") and name.endswith(".py"):
                with open(os.path.join(REPO, directory, name)) as f:
                    if re.search(r"^pytestmark = pytest\.mark\.sim|^@pytest\.mark\.sim", f.read(), re.M):
                        sim_files.append(name)
    assert len(sim_files) > 10
    assert sorted(set(sim_files) - set(conftest.FILE_SECONDS)) == []
    assert sorted(set(conftest.FILE_SECONDS) - set(sim_files)) == []
