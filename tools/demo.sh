#!/usr/bin/env bash
# make demo: the whole journey on a fresh 4-node simulated A3 cluster with a few GB of synthetic weights:
# inventory check -> preflight -> weight copy -> deploy -> validate -> benchmark (playbooks/site.yml),
# ending with the endpoint and the report. The cluster stays up afterwards so you can look around
# (`make sim-status`, the ssh lines printed below, curl the endpoint); `make sim-down` ends it.
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg" PYTHONPATH="$PWD/sim" PATH="$PWD/.venv/bin:$PATH"
NODES=${NODES:-4}
WEIGHTS=${DEMO_WEIGHTS:-2G}
if [ "$(id -u)" != 0 ]; then
  echo "make demo needs root: the simulated nodes are network and mount namespaces with their own sshd" >&2
  exit 1
fi
python -m npuops_sim down >/dev/null
python -m npuops_sim up --nodes "$NODES" --profile a3 --inventory inventories/sim/hosts.yml
python -m npuops_sim weights --node 1 --size "$WEIGHTS" --files 8
reports="$PWD/reports"
ansible-playbook -i inventories/sim playbooks/site.yml \
  -e '{"npuops_bench_matrix": "sim", "npuops_reports_dir": "'"$reports"'"}'
report=$(ls -1d "$reports"/bench-*/ | sort | tail -n 1)
endpoint=$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["endpoint"])' "$report/meta.json")
echo
echo "demo: done."
echo "  endpoint: $endpoint   (try: curl -s $endpoint/v1/models)"
echo "  report:   ${report}report.md"
echo "The simulated cluster is still up: make sim-status | make sim-down"
