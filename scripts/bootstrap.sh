#!/usr/bin/env bash
# Installs what fleet's demo and tests need, idempotently:
#   - OpenSSH's server (sshd) and client, when missing and we may install them
#     (skipped with FLEET_BOOTSTRAP_NO_SSHD=1: the fast lane needs no sshd);
#   - a virtualenv in .venv with fleet and its test extras (editable), at the versions
#     pinned in constraints.txt (CI and a fresh machine get the same versions).
set -euo pipefail
cd "$(dirname "$0")/.."

have_sshd() { command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; }

if [ "${FLEET_BOOTSTRAP_NO_SSHD:-0}" != 1 ] && { ! have_sshd || ! command -v ssh-keygen >/dev/null 2>&1; }; then
  echo "bootstrap: installing OpenSSH (server and client)" >&2
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq openssh-server openssh-client >/dev/null
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
    sudo -n env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null
  else
    echo "bootstrap: OpenSSH's server is needed (sshd): install the openssh-server package" >&2
    exit 2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv" >&2
  "$PY" -m venv .venv
fi
# Reinstall only when pyproject.toml or constraints.txt changed since the last install.
stamp=.venv/.fleet-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! .venv/bin/python -c "import fleet" 2>/dev/null; then
  echo "bootstrap: installing fleet and its test tools into .venv" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade -c constraints.txt pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]'
  echo "$want" > "$stamp"
fi

# --docker: also a Docker engine and the docker-sshd sandbox's base image (idempotent).
for arg in "$@"; do
  if [ "$arg" = --docker ]; then exec scripts/docker-engine.sh start; fi
done
