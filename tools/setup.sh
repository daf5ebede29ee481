#!/usr/bin/env bash
# make setup: the system packages the simulated cluster and the monitoring tests need (when run as root) and .venv with the
# controller stack of pyproject.toml. Idempotent: a stamp keyed on pyproject.toml and this script makes
# the second run a few dpkg/stat calls.
set -euo pipefail
cd "$(dirname "$0")/.."

SYSTEM_PACKAGES=(podman runc openssh-server mmdebstrap iproute2 iputils-ping rsync util-linux prometheus haproxy
                 keepalived)
PYTHON=${PYTHON:-python3}
VENV=.venv

missing_packages() {
  command -v dpkg-query >/dev/null || return 0
  local pkg
  for pkg in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q 'install ok installed' || echo "$pkg"
  done
}

missing=$(missing_packages)
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing system packages: $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $missing >/dev/null
  else
    echo "setup: note: missing system packages ($missing); the simulated cluster needs them (run as root to install)" >&2
  fi
fi

if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
  else
    echo "setup: $PYTHON has no venv/ensurepip; install python3-venv" >&2; exit 1
  fi
fi

stamp="$VENV/.npuops-setup-$(cat pyproject.toml tools/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ -x "$VENV/bin/ansible-playbook" ]; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
deps=$("$VENV/bin/python" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
)
echo "setup: installing the controller stack into $VENV"
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q --disable-pip-version-check $(echo "$deps" | tr '\n' ' ') \
  2> >(grep -v "^WARNING: Location 'file:" >&2)
rm -f "$VENV"/.npuops-setup-*
touch "$stamp"
echo "setup: ready ($("$VENV/bin/ansible" --version | head -n1))"
