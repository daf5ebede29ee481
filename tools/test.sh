#!/usr/bin/env bash
# make test: everything CI runs. `tools/test.sh <stage>...` runs some.
#   lint    yamllint, ansible-lint (production profile, offline), ruff
#   unit    pytest: collection module_utils/filters, simulator logic, conformance of the simulated engine and PD
#           proxy with the openai SDK on loopback (no root, no network)
#   sanity  ansible-test sanity from the collection directory (offline get-pip stand-in); its unit tests are the
#           unit stage's
#   sim     pytest -m sim: the simulator, the playbooks on it and the molecule scenario(s) of MOLECULE_SCENARIOS
#           (default: the 16-node PD one), in SIM_LANES pytest-xdist lanes (default 3), each lane with its own
#           cluster id and address ranges (root: namespaces, sshd, podman)
#   molecule  molecule scenarios directly (MOLECULE_SCENARIOS=all, as `make molecule` does: every one)
#   vllm_args the example inventories' vllm serve command lines, checked by the own parser of every vLLM version
#             of data/images.yml; vLLM's own bench request functions against the simulated engine (pytest -m vllm)
#   collection  the collection built into its tarball, installed into an empty path, planning an example
#             inventory from a directory outside the repository
#   lm_eval the accuracy role driving the real lm-eval (.venv-lmeval, built in the background meanwhile) against
#           the simulated engine on loopback (pytest -m lmeval)
# With sim among several stages it starts first, in the background, and the other stages run meanwhile (most of a
# sim test is waiting on SSH and the engines); its output follows theirs.
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg" PYTHONPATH="$PWD/sim" PATH="$PWD/.venv/bin:$PATH"
COLLECTION=collections/ansible_collections/npuops/ascend
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(lint unit sanity collection vllm_args lm_eval sim)

timed() {
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name"
  "$@"
  echo "=== $name: ok in $((SECONDS - t0))s"
}

lint() {
  yamllint -s .
  ansible-lint -q
  ruff check .
}

unit() {
  # two workers: many of these tests wait on loopback servers and timeouts, not on the CPU
  pytest -q -m "not sim and not vllm and not lmeval" -p no:cacheprovider -n 2
}

sanity() {
  local pip_version
  pip_version=$(python - <<'PY'
import re, ansible_test, pathlib
text = (pathlib.Path(ansible_test.__file__).parent / "_internal/python_requirements.py").read_text()
print(re.search(r"pip='([0-9.]+)'", text).group(1))
PY
)
  mkdir -p ~/.ansible/test/cache
  cp tools/get_pip_offline.py ~/.ansible/test/cache/get_pip_"${pip_version//./_}".py
  # ansible-test prints every pip step of its venvs: keep that in a log, show it only on failure
  mkdir -p "$PWD/.logs"
  local log="$PWD/.logs/ansible-test.log"
  run_logged "$log" bash -c "cd $COLLECTION && ansible-test sanity --venv --python 3.11 --color no"
  grep -E '^(Running sanity test|WARNING: Skipping|ERROR)' "$log" | sed 's/^/  /' || true
}

run_logged() {
  local log=$1; shift
  if ! "$@" >"$log" 2>&1; then
    grep -v -e "^WARNING: Location 'file:" -e '^Looking in' -e '^Collecting' -e '^  Downloading' \
      -e '━━' "$log" | tail -n 150
    echo "failed: $* (full log: $log)" >&2
    return 1
  fi
}

sim_lanes() {
  python - "$1" <<'PY'
import sys
from npuops_sim.testing import lane_env
for lane in range(int(sys.argv[1])):
    print(lane_env({"PYTEST_XDIST_WORKER": "gw%d" % lane})["SIM_ID"])
PY
}

sim() {
  if [ "$(id -u)" != 0 ]; then
    echo "the simulated-cluster tests need root (network and mount namespaces)" >&2
    return 1
  fi
  python -m npuops_sim image >/dev/null  # built once here: every lane's clusters share it
  # files in conftest.py's order (longest first), not re-sorted by their number of tests
  pytest -q -m sim -p no:cacheprovider -n "$SIM_LANES" --dist loadfile --no-loadscope-reorder --durations=0 \
    --basetemp=/tmp/npuops-sim-pytest sim/tests tests
}

# sim in the background (its own process group, output in a log); ends it, and downs its lanes' clusters and
# molecule's, when the script exits before it finished.
sim_pid=
sim_log="$PWD/.logs/sim.log"
sim_start() {
  mkdir -p "$PWD/.logs"
  setsid bash -c "set -eo pipefail; $(declare -f sim); SIM_LANES=$SIM_LANES; sim" >"$sim_log" 2>&1 &
  sim_pid=$!
}
sim_wait() {
  local rc=0
  wait "$sim_pid" || rc=$?
  sim_pid=
  cat "$sim_log"
  return $rc
}
sim_abort() {
  [ -n "$sim_pid" ] || return 0
  kill -TERM -- "-$sim_pid" 2>/dev/null || true
  wait "$sim_pid" 2>/dev/null || true
  local id
  for id in $(sim_lanes "$SIM_LANES") npmo; do
    SIM_ID=$id python -m npuops_sim down >/dev/null 2>&1 || true
  done
  echo "sim stage ended early (its log: $sim_log)" >&2
}

collection() {
  # The collection must work installed from its tarball, away from this repository (its roles, tier documents
  # and filters all inside it), as an operator would use it from Galaxy.
  local tmp
  tmp=$(mktemp -d)
  (cd "$COLLECTION" && ansible-galaxy collection build --force --output-path "$tmp/dist" >/dev/null)
  # away from this repository's ansible.cfg, whose collections path already holds the collection's source
  (cd "$tmp" && env -u ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH="$tmp/collections" ansible-galaxy collection install \
    --offline --force -p "$tmp/collections" "$tmp"/dist/npuops-ascend-*.tar.gz >/dev/null)
  mkdir -p "$tmp/site"
  cp playbooks/plan.yml "$tmp/site/"
  cp -r inventories/a3-8p8d "$tmp/site/inventory"
  (cd "$tmp/site" && env -u ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH="$tmp/collections" \
    ansible-playbook -i inventory plan.yml -e plan_output="$tmp/site/plan.json" >"$tmp/site/out.log" 2>&1) || {
    tail -n 60 "$tmp/site/out.log"; echo "plan.yml failed with the installed collection" >&2; rm -rf "$tmp"; return 1; }
  python3 - "$tmp/site/plan.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["tier"] == "8p8d_pd" and len(plan["hosts"]) == 16, plan.get("tier")
assert plan["endpoint"] == "http://192.168.100.11:8080", plan["endpoint"]
print("  collection: installed from its tarball, planned %d hosts of %s" % (len(plan["hosts"]), plan["tier"]))
PY
  # Galaxy's own importer on the tarball (ansible-test and ansible-lint are the sanity and lint stages'): it must
  # end without an ERROR line
  local rc=0 cfg="$PWD/tools/galaxy-importer.cfg"
  (cd "$tmp" && env -u ANSIBLE_CONFIG GALAXY_IMPORTER_CONFIG="$cfg" \
    python -m galaxy_importer.main "$tmp"/dist/npuops-ascend-*.tar.gz >"$tmp/importer.log" 2>&1) || rc=$?
  if [ "$rc" != 0 ] || grep -q "ERROR" "$tmp/importer.log"; then
    grep -E "ERROR|WARNING|Traceback" "$tmp/importer.log" | tail -n 40
    echo "galaxy-importer refused the collection (rc=$rc)" >&2; rm -rf "$tmp"; return 1
  fi
  echo "  collection: galaxy-importer: $(grep -c WARNING "$tmp/importer.log") warning(s), no error"
  rm -rf "$tmp"
}

vllm_args() {
  if [ -n "${vllm_prepare_pid:-}" ]; then
    wait "$vllm_prepare_pid" || { cat "$PWD/.logs/vllm-prepare.log"; echo "building .venv-vllm failed" >&2; return 1; }
    vllm_prepare_pid=
  fi
  tools/vllm_argcheck.sh
}

lm_eval() {
  if [ -n "${lmeval_prepare_pid:-}" ]; then
    wait "$lmeval_prepare_pid" || { cat "$PWD/.logs/lmeval-prepare.log"; echo "building .venv-lmeval failed" >&2; return 1; }
    lmeval_prepare_pid=
  fi
  tools/lmeval.sh
}

molecule() {
  # CI runs the 16-node PD scenario (a 16-node rollout, its idempotence and a decode-only change are tested
  # nowhere else); `MOLECULE_SCENARIOS=all` (make molecule) runs every scenario. The 2- and 4-node tiers'
  # rollouts, re-runs and faults are the sim stage's tests on clusters of those sizes.
  local scenario scenarios=${MOLECULE_SCENARIOS:-tier_8p8d_pd}
  [ "$scenarios" != all ] || scenarios=$(for s in molecule/*/molecule.yml; do basename "$(dirname "$s")"; done)
  for scenario in $scenarios; do
    mkdir -p "$PWD/.logs"
    local log="$PWD/.logs/molecule-$scenario.log"
    local t0=$SECONDS
    if ! command molecule test -s "$scenario" >"$log" 2>&1; then
      sed 's/\x1b\[[0-9;]*m//g' "$log" | tail -n 120
      echo "molecule scenario $scenario failed (full log: $log)" >&2
      return 1
    fi
    echo "  molecule $scenario: ok in $((SECONDS - t0))s"
  done
}

SIM_LANES=${SIM_LANES:-3}
# .venv-vllm is mostly downloads and unpacking: built in the background from the start when other stages come
# before vllm_args (CI time)
vllm_prepare_pid=
lmeval_prepare_pid=
cleanup() {
  [ -z "$vllm_prepare_pid" ] || kill -TERM -- "-$vllm_prepare_pid" 2>/dev/null || true
  [ -z "$lmeval_prepare_pid" ] || kill -TERM -- "-$lmeval_prepare_pid" 2>/dev/null || true
  sim_abort
}
trap cleanup EXIT
if [[ " ${stages[*]} " == *" vllm_args "* ]] && [ "${stages[0]}" != vllm_args ]; then
  mkdir -p "$PWD/.logs"
  # its own process group, so that a failing stage before vllm_args ends the build (pip and all) with the script
  setsid tools/vllm_argcheck.sh --prepare >"$PWD/.logs/vllm-prepare.log" 2>&1 &
  vllm_prepare_pid=$!
fi
if [[ " ${stages[*]} " == *" lm_eval "* ]] && [ "${stages[0]}" != lm_eval ]; then
  mkdir -p "$PWD/.logs"
  setsid tools/lmeval.sh --prepare >"$PWD/.logs/lmeval-prepare.log" 2>&1 &
  lmeval_prepare_pid=$!
fi
t_all=$SECONDS
if [[ " ${stages[*]} " == *" sim "* ]] && [ ${#stages[@]} -gt 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "the simulated-cluster tests need root (network and mount namespaces)" >&2; exit 1; }
  t_sim=$SECONDS
  echo "=== sim: started in the background (${SIM_LANES} lanes; log $sim_log)"
  sim_start
fi
for stage in "${stages[@]}"; do
  if [ "$stage" = sim ] && [ -n "$sim_pid" ]; then
    continue
  fi
  timed "$stage" "$stage"
done
if [ -n "$sim_pid" ]; then
  echo "=== sim (waiting for it)"
  sim_wait
  echo "=== sim: ok in $((SECONDS - t_sim))s"
fi
echo "make test: all stages passed (${stages[*]}) in $((SECONDS - t_all))s"
