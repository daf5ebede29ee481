"""Fixtures for the simulator's own tests; the helpers live in npuops_sim.testing."""
import pytest

from npuops_sim.testing import BIN, REPO, TEST_ENV, SimCluster, bring_up, run, sim  # noqa: F401


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    c = bring_up(tmp_path_factory, 4)
    yield c
    sim("down", timeout=300)
