#!/usr/bin/env bash
# The whole test suite: lint, types, unit tests, and integration tests against real sshd
# sandbox hosts started by the tests themselves. Installs what it needs first.
#   scripts/test.sh                 everything
#   scripts/test.sh tests/unit -k x  extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
.venv/bin/python -m pytest "${@:-tests}"
