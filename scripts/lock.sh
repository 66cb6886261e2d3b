#!/usr/bin/env bash
# Regenerate constraints.txt: resolve pyproject.toml's dependencies and test extra in a
# scratch virtualenv (no constraints) and pin what got installed.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'
{
  echo "# Pinned versions of fleet's dependencies and test tools: scripts/bootstrap.sh installs"
  echo "# with -c constraints.txt so CI and a fresh machine get the same versions. Regenerate"
  echo "# after changing pyproject.toml: scripts/lock.sh"
  "$tmp/venv/bin/python" -m pip --version | awk '{print "pip==" $2}'
  "$tmp/venv/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check
} > constraints.txt
echo "constraints.txt: $(grep -c '==' constraints.txt) pins"
