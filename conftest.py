"""Test lanes: `tools/test.sh sim` runs the simulated-cluster tests as pytest-xdist workers that take whole files
(`--dist loadfile`), each worker a lane with its own cluster id and address ranges (npuops_sim.testing.lane_env).
A worker is handed the next file in collection order, so the longest files go first: the lanes then finish
together instead of one lane starting a long file last."""

# Seconds per file in the last measured run (`--durations=0` of the sim stage of a clean-clone `make test`, summed
# per file; approximate, ordering only). Files not listed keep their place after these. pytest-xdist would reorder
# the files by their number of tests: tools/test.sh passes --no-loadscope-reorder so that this order holds.
FILE_SECONDS = {
    "test_gateway.py": 1480,
    "test_weights_playbook.py": 1216,
    "test_site_playbook.py": 643,
    "test_molecule_scenarios.py": 512,
    "test_deploy_playbook.py": 344,
    "test_validate_playbook.py": 312,
    "test_status_recover.py": 281,
    "test_diagnose_playbook.py": 258,
    "test_xpyd.py": 206,
    "test_container_engines.py": 177,
    "test_monitor_playbook.py": 170,
    "test_diagnose_16.py": 116,
    "test_preflight_playbook.py": 97,
    "test_a2_tier.py": 84,
    "test_cluster.py": 53,
    "test_lifecycle.py": 26,
}


def pytest_collection_modifyitems(session, config, items):
    order = dict((name, -seconds) for name, seconds in FILE_SECONDS.items())
    items.sort(key=lambda item: order.get(item.path.name, 0))  # stable: a file's tests keep their order
