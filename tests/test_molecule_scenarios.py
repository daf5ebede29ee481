"""The molecule scenarios, run by the sim stage beside the playbook tests (each test lane is a pytest-xdist worker,
so the scenario takes a lane like any test module). MOLECULE_SCENARIOS picks them: the default is the 16-node PD
one (a 16-node rollout, its idempotence and a decode-only change are tested nowhere else), `all` runs every one;
`make molecule` runs them outside pytest. A scenario brings up its own cluster with molecule's id and ranges."""
import glob
import os
import re
import subprocess

import pytest
import yaml

from npuops_sim.testing import BIN, REPO, env

pytestmark = pytest.mark.sim


def scenarios():
    chosen = os.environ.get("MOLECULE_SCENARIOS", "tier_8p8d_pd")
    if chosen == "all":
        return sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(REPO, "molecule", "*",
                                                                                            "molecule.yml")))
    return chosen.split()


@pytest.mark.parametrize("scenario", scenarios())
def test_molecule_scenario(scenario, tmp_path):
    log = tmp_path / ("molecule-%s.log" % scenario)
    with open(log, "w") as out:
        proc = subprocess.run([BIN + "/molecule", "test", "-s", scenario], cwd=REPO, env=env(), stdout=out,
                              stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=1800)
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
    assert proc.returncode == 0, "molecule scenario %s failed (log %s):\n%s" % (scenario, log, text[-6000:])
    # every step of the scenario's sequence ran (a scenario that skipped its verifier would pass too)
    with open(os.path.join(REPO, "molecule", scenario, "molecule.yml")) as f:
        sequence = yaml.safe_load(f)["scenario"]["test_sequence"]
    for step in sequence:
        assert re.search(r"%s ➜ %s: Executing" % (re.escape(scenario), step), text), "step %s did not run" % step
