#!/usr/bin/env bash
# make demo: a fresh 4-node simulated A3 cluster, then the rollout on it over SSH. The cluster stays up
# afterwards so you can look around (`make sim-status`, `ssh` lines printed below); `make sim-down` ends it.
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg" PYTHONPATH="$PWD/sim" PATH="$PWD/.venv/bin:$PATH"
NODES=${NODES:-4}
if [ "$(id -u)" != 0 ]; then
  echo "make demo needs root: the simulated nodes are network and mount namespaces with their own sshd" >&2
  exit 1
fi
python -m npuops_sim down >/dev/null
python -m npuops_sim up --nodes "$NODES" --profile a3 --inventory inventories/sim/hosts.yml
ansible-playbook -i inventories/sim playbooks/npu_table.yml
echo
echo "demo: done. The simulated cluster is still up: make sim-status | make sim-down"
