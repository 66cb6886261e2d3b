#!/usr/bin/env bash
# The whole test suite: format, lint, types, unit tests, and integration tests against real
# sshd sandbox hosts started by the tests themselves. Installs what it needs first.
#   scripts/test.sh                  everything
#   scripts/test.sh --fast           the fast lane: no sshd hosts (pytest -m "not integration")
#   scripts/test.sh tests/unit -k x  extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
if [ "$fast" = 1 ]; then
  FLEET_BOOTSTRAP_NO_SSHD=1 scripts/bootstrap.sh
else
  scripts/bootstrap.sh
fi

echo "== ruff format --check"
.venv/bin/ruff format --check .
echo "== ruff check"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
if [ "$fast" = 1 ]; then
  .venv/bin/python -m pytest -m "not integration" "${@:-tests}"
else
  .venv/bin/python -m pytest "${@:-tests}"
fi
