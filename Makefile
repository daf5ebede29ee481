# npuops: thin targets, each one script. `make demo` and `make test` are the two that matter.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
NODES ?= 4
PROFILE ?= a3
REPLICAS ?= 1
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PYTHONPATH := $(CURDIR)/sim

.PHONY: setup demo test lint unit sanity sim-tests molecule bench inventory-vars sim-up sim-down sim-fault sim-status

setup:
	@tools/setup.sh

demo: setup
	@tools/demo.sh

test: setup
	@tools/test.sh

lint: setup
	@tools/test.sh lint

unit: setup
	@tools/test.sh unit

sanity: setup
	@tools/test.sh sanity

sim-tests: setup
	@tools/test.sh sim

molecule: setup
	@MOLECULE_SCENARIOS=$${MOLECULE_SCENARIOS:-all} tools/test.sh molecule

bench: setup
	@tools/bench.sh

# after changing data/inventory_variables.yml: rewrite what the table makes (the plan role's argument spec and
# README table, docs/inventory.md, inventories/sample/group_vars/all.yml); a unit test fails until they match
inventory-vars: setup
	@$(PY) tools/inventory_vars.py

sim-up: setup
	@$(PY) -m npuops_sim up --nodes $(NODES) --profile $(PROFILE) --replicas $(REPLICAS) \
	  --inventory inventories/sim/hosts.yml \
	  $(foreach f,$(FAULTS),--fault $(f))

sim-down: setup
	@$(PY) -m npuops_sim down

sim-fault: setup
	@$(PY) -m npuops_sim fault --node "$(NODE)" --fault "$(FAULT)" --device "$(DEVICE)" --peer "$(PEER)" --port "$(PORT)"

sim-status: setup
	@$(PY) -m npuops_sim status
