#!/usr/bin/env bash
# make test: everything CI runs, in the order that fails fastest. `tools/test.sh <stage>...` runs some.
#   lint    yamllint, ansible-lint (production profile, offline), ruff
#   unit    pytest: collection module_utils/filters, simulator logic, conformance of the simulated engine and PD
#           proxy with the openai SDK on loopback (no root, no network)
#   sanity  ansible-test sanity + units from the collection directory (offline get-pip stand-in)
#   sim     pytest -m sim: the simulated cluster, and the playbooks on it (root: namespaces, sshd, podman)
#   molecule  the molecule scenarios on the simulated cluster (CI: the 16-node PD one; MOLECULE_SCENARIOS=all: every one);
#           with sim also asked for, run by the first sim stream once its tests are done
#   vllm_args the example inventories' vllm serve command lines, checked by the own parser of every vLLM version
#             of data/images.yml; vLLM's own bench request functions against the simulated engine (pytest -m vllm)
#   collection  the collection built into its tarball, installed into an empty path, planning an example
#             inventory from a directory outside the repository
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg" PYTHONPATH="$PWD/sim" PATH="$PWD/.venv/bin:$PATH"
COLLECTION=collections/ansible_collections/npuops/ascend
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(lint unit sanity collection vllm_args sim molecule)

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
  pytest -q -m "not sim and not vllm"
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
  if [ -n "$(find "$COLLECTION/tests/unit" -name 'test_*.py' -print -quit 2>/dev/null)" ]; then
    run_logged "$log" bash -c "cd $COLLECTION && ansible-test units --venv --python 3.11 --color no"
    grep -E '^=+ .*(passed|failed)' "$log" | sed 's/^/  units: /' || true
  fi
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

sim() {
  if [ "$(id -u)" != 0 ]; then
    echo "the simulated-cluster tests need root (network and mount namespaces)" >&2
    return 1
  fi
  # The simulator's own tests first, alone: they check that `down` leaves nothing on the machine.
  pytest -q -m sim -p no:cacheprovider --durations=10 sim/tests
  # Then the playbook tests in two streams side by side (2 cores; most of a test is waiting on SSH and the
  # engines): the second has its own cluster id, address ranges and state root, as a second checkout would.
  # (balanced so that the first stream's tests plus the molecule stage take about as long as the second)
  local second=(tests/test_gateway.py tests/test_weights_playbook.py tests/test_monitor_playbook.py
                tests/test_preflight_playbook.py tests/test_validate_playbook.py)
  local first=() module
  for module in tests/test_*.py; do
    [[ " ${second[*]} " == *" $module "* ]] || first+=("$module")
  done
  mkdir -p "$PWD/.logs"
  local log="$PWD/.logs/sim-second-stream.log" root=/var/lib/npuops-sim-ci2
  env SIM_ROOT=$root python -m npuops_sim image >/dev/null  # the image from the cache the first stage filled
  env NPUOPS_TEST_SIM_ID=npci2 NPUOPS_TEST_MGMT_NET=10.225.0.0/24 NPUOPS_TEST_FABRIC_NET=10.226.0.0/20 \
    SIM_ROOT=$root pytest -q -m sim -p no:cacheprovider --basetemp=/tmp/npuops-ci2-pytest --durations=15 "${second[@]}" >"$log" 2>&1 &
  local pid=$! rc=0 rc2=0
  pytest -q -m sim -p no:cacheprovider --durations=15 "${first[@]}" || rc=$?
  if [ "$rc" = 0 ] && $sim_runs_molecule; then
    timed molecule molecule || rc=$?
  fi
  wait "$pid" || rc2=$?
  echo "--- second stream (${second[*]}):"
  cat "$log"
  [ "$rc" = 0 ] && [ "$rc2" = 0 ]
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
  rm -rf "$tmp"
}

vllm_args() {
  if [ -n "${vllm_prepare_pid:-}" ]; then
    wait "$vllm_prepare_pid" || { cat "$PWD/.logs/vllm-prepare.log"; echo "building .venv-vllm failed" >&2; return 1; }
    vllm_prepare_pid=
  fi
  tools/vllm_argcheck.sh
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

# .venv-vllm is mostly downloads and unpacking: built in the background from the start when other stages come
# before vllm_args (CI time)
vllm_prepare_pid=
# With both sim and molecule asked for (in either order), sim's first stream runs molecule once its tests are
# done (molecule has its own cluster id and address ranges) while the second stream is still running.
sim_runs_molecule=false
[[ " ${stages[*]} " != *" sim "* || " ${stages[*]} " != *" molecule "* ]] || sim_runs_molecule=true
if [[ " ${stages[*]} " == *" vllm_args "* ]] && [ "${stages[0]}" != vllm_args ]; then
  mkdir -p "$PWD/.logs"
  # its own process group, so that a failing stage before vllm_args ends the build (pip and all) with the script
  setsid tools/vllm_argcheck.sh --prepare >"$PWD/.logs/vllm-prepare.log" 2>&1 &
  vllm_prepare_pid=$!
  trap '[ -z "$vllm_prepare_pid" ] || kill -TERM -- "-$vllm_prepare_pid" 2>/dev/null || true' EXIT
fi
for stage in "${stages[@]}"; do
  [ "$stage" != molecule ] || ! $sim_runs_molecule || continue
  timed "$stage" "$stage"
done
echo "make test: all stages passed (${stages[*]})"
