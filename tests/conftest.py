"""Project-level tests: playbooks against the simulated cluster (marker `sim`, one cluster per module, each module
bringing up the fewest nodes that show what it tests) and against the example inventories with playbooks that contact
no host."""
