#!/usr/bin/env bash
# The command lines plan.yml renders for the example inventories, checked by the real `vllm serve` parser of each
# vLLM version of the image table (data/images.yml), and the table checked against each version's registries.
# One venv (.venv-vllm, built once: torch from this machine's local wheel and what the parsers import), and each
# vLLM version installed beside it with --no-deps under .venv-vllm/versions/<version> (cached by a stamp), put on
# PYTHONPATH one at a time (`--prepare`: only that). Then the conformance tests that drive the simulator with vLLM's own bench request
# functions (pytest -m vllm) run with the same venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
req_stamp="$VENV/.npuops-$(sha256sum tools/vllm-argcheck-requirements.txt | cut -c1-16)"
if [ ! -f "$req_stamp" ]; then
  echo "vllm-args: building $VENV (vLLM's parsers on the CPU; once)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r tools/vllm-argcheck-requirements.txt \
    2> >(grep -v -e "^WARNING: Location 'file:" -e "which is not installed" -e "which is incompatible" >&2)
  touch "$req_stamp"
fi
mapfile -t versions < <(.venv/bin/python - <<'PY'
import yaml
with open("collections/ansible_collections/npuops/ascend/data/images.yml") as f:
    print("\n".join(sorted(set(str(line["vllm"]) for line in yaml.safe_load(f)["images"]))))
PY
)
for v in "${versions[@]}"; do
  if [ ! -f "$VENV/versions/$v/.npuops-installed" ]; then
    echo "vllm-args: installing vLLM $v (--no-deps, once)"
    rm -rf "$VENV/versions/$v"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --target "$VENV/versions/$v" "vllm==$v" \
      2> >(grep -v "^WARNING: Location 'file:" >&2)
    touch "$VENV/versions/$v/.npuops-installed"
  fi
done
[ "${1:-}" != --prepare ] || exit 0  # make test builds the venvs in the background while lint, unit and sanity run
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# a3-8node-canary: an instance that serves two names (--served-model-name is nargs="+"); a3-4node-dspark: the
# tutorial's --speculative-config on every engine
for inv in a3-2node a3-4node a3-8p8d a3-8node-canary a3-4node-dspark; do
  ANSIBLE_CONFIG="$PWD/ansible.cfg" .venv/bin/ansible-playbook -i "inventories/$inv" playbooks/plan.yml \
    -e "plan_output=$out/$inv.json" >/dev/null
done
status=0
for v in "${versions[@]}"; do
  (cd "$out" && PYTHONPATH="$OLDPWD/$VENV/versions/$v" "$OLDPWD/$VENV/bin/python" "$OLDPWD/tools/vllm_argcheck.py" \
    "$out"/*.json) || status=1
done
[ "$status" = 0 ] || exit 1
NPUOPS_VLLM_VENV="$PWD/$VENV" .venv/bin/pytest -q -m vllm -p no:cacheprovider
