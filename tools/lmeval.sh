#!/usr/bin/env bash
# The real lm-eval for the accuracy stage's suite test: the Language Model Evaluation Harness, pinned
# (tools/lmeval-requirements.txt), in its own venv (.venv-lmeval: datasets, pyarrow and scikit-learn are no business
# of the controller's .venv), built once (`--prepare`: only that). Then pytest -m lmeval: the accuracy role runs it
# against the simulated engine on loopback with a small local dataset and reads back what it wrote.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-lmeval
stamp="$VENV/.npuops-$(sha256sum tools/lmeval-requirements.txt | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "lm_eval: building $VENV (once)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r tools/lmeval-requirements.txt \
    2> >(grep -v "^WARNING: Location 'file:" >&2)
  touch "$stamp"
fi
[ "${1:-}" != --prepare ] || exit 0
NPUOPS_LM_EVAL="$PWD/$VENV/bin/lm_eval" .venv/bin/pytest -q -m lmeval -p no:cacheprovider
