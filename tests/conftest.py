"""Project-level tests: playbooks against the simulated cluster (marker `sim`) and against the example
inventories with playbooks that contact no host."""
import pytest

from npuops_sim.testing import bring_up, sim


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    c = bring_up(tmp_path_factory, 4)
    yield c
    sim("down", timeout=300)
