#!/usr/bin/env bash
# make bench: every benchmark under bench/ (each prints ratios measured side by side in one run).
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg" PYTHONPATH="$PWD/sim" PATH="$PWD/.venv/bin:$PATH"
found=0
for b in bench/*; do
  [ -x "$b" ] && [ -f "$b" ] || continue
  found=1
  echo "=== $b"
  "$b"
done
[ "$found" = 1 ] || echo "bench: no benchmarks yet"
