"""Test lanes: `tools/test.sh sim` runs the simulated-cluster tests as pytest-xdist workers that take whole files
(`--dist loadfile`), each worker a lane with its own cluster id and address ranges (npuops_sim.testing.lane_env).
A worker is handed the next file in collection order, so the longest files go first: the lanes then finish
together instead of one lane starting a long file last."""

# Seconds per file in the last measured run (`--durations=0` of the sim stage of a clean-clone `make test`, summed
# per file; approximate, ordering only). Files not listed keep their place after these. pytest-xdist would reorder
# the files by their number of tests: tools/test.sh passes --no-loadscope-reorder so that this order holds.
FILE_SECONDS = {
    "test_weights_playbook.py": 958,
    "test_site_playbook.py": 586,
    "test_molecule_scenarios.py": 529,
    "test_gateway.py": 493,
    "test_deploy_playbook.py": 382,
    "test_status_recover.py": 273,
    "test_diagnose_playbook.py": 201,
    "test_validate_playbook.py": 178,
    "test_container_engines.py": 124,
    "test_monitor_playbook.py": 110,
    "test_xpyd.py": 121,  # measured alone
    "test_diagnose_16.py": 96,
    "test_a2_tier.py": 91,
    "test_cluster.py": 62,
    "test_preflight_playbook.py": 51,
    "test_lifecycle.py": 27,
}


def pytest_collection_modifyitems(session, config, items):
    order = dict((name, -seconds) for name, seconds in FILE_SECONDS.items())
    items.sort(key=lambda item: order.get(item.path.name, 0))  # stable: a file's tests keep their order
