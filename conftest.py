"""Test lanes: `tools/test.sh sim` runs the simulated-cluster tests as pytest-xdist workers that take whole files
(`--dist loadfile`), each worker a lane with its own cluster id and address ranges (npuops_sim.testing.lane_env).
A worker is handed the next file in collection order, so the longest files go first: the lanes then finish
together instead of one lane starting a long file last."""

# Seconds per file in the last measured run (`--durations=0` of the sim stage, 3 lanes on the 2-core machine, summed
# per file; approximate, ordering only; tests/README.md holds the budget per file). Files not listed keep their place
# after these. pytest-xdist would reorder the files by their number of tests: tools/test.sh passes
# --no-loadscope-reorder so that this order holds. A sim test file that is not listed fails the unit test
# tests/test_collection_release.py::test_every_sim_test_file_has_its_seconds_in_the_lane_order.
FILE_SECONDS = {
    "test_gateway.py": 1355,
    "test_weights_playbook.py": 1140,
    "test_site_playbook.py": 627,
    "test_answers_gate.py": 577,
    "test_status_recover.py": 470,
    "test_deploy_playbook.py": 453,
    "test_diagnose_playbook.py": 337,
    "test_molecule_scenarios.py": 320,
    "test_validate_playbook.py": 247,
    "test_xpyd.py": 225,
    "test_container_engines.py": 212,
    "test_a2_tier.py": 179,
    "test_pd_4p4d.py": 159,
    "test_diagnose_16.py": 152,
    "test_monitor_playbook.py": 148,
    "test_preflight_playbook.py": 133,
    "test_cluster.py": 79,
    "test_lifecycle.py": 79,
}


def pytest_collection_modifyitems(session, config, items):
    order = dict((name, -seconds) for name, seconds in FILE_SECONDS.items())
    items.sort(key=lambda item: order.get(item.path.name, 0))  # stable: a file's tests keep their order
