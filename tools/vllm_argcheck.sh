#!/usr/bin/env bash
# The command lines plan.yml renders for the example inventories, checked by vLLM's own `vllm serve` parser
# (vLLM 0.32.0 on the CPU, in its own venv .venv-vllm, built once: torch from this machine's local wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
VLLM=vllm==0.32.0
stamp="$VENV/.npuops-$(cat tools/vllm-argcheck-requirements.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "vllm-args: building $VENV (vLLM's parser on the CPU; once)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r tools/vllm-argcheck-requirements.txt \
    2> >(grep -v -e "^WARNING: Location 'file:" -e "which is not installed" -e "which is incompatible" >&2)
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "$VLLM" \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
  touch "$stamp"
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for inv in a3-2node a3-4node a3-8p8d; do
  ANSIBLE_CONFIG="$PWD/ansible.cfg" .venv/bin/ansible-playbook -i "inventories/$inv" playbooks/plan.yml \
    -e "plan_output=$out/$inv.json" >/dev/null
done
(cd "$out" && "$OLDPWD/$VENV/bin/python" "$OLDPWD/tools/vllm_argcheck.py" "$out"/*.json)
