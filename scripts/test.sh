#!/usr/bin/env bash
# The whole test suite: format, lint, types, unit tests, and integration tests against real
# sshd sandbox hosts started by the tests themselves, then the docker stage (the tests
# marked `docker` on docker-sshd hosts: scripts/test-docker.sh), then the real-engine stage
# (the tests marked `real` against vLLM's CPU build: scripts/test-real.sh). Installs what
# it needs first.
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
  exec .venv/bin/python -m pytest -m "not integration" "${@:-tests}"
fi
rc=0
.venv/bin/python -m pytest "${@:-tests}" || rc=$?
# The docker stage (scripts/test-docker.sh): the tests marked `docker` again, on docker-sshd
# hosts; skipped with a one-line reason where no Docker engine can be had. Only for the
# whole run (not with pytest arguments, not --fast), and run even when the suite above
# failed, so one run reports both.
if [ $# -gt 0 ]; then
  exit "$rc"
fi
if [ "${FLEET_SANDBOX_BACKEND:-local}" = docker ]; then
  echo "== docker stage not run again: FLEET_SANDBOX_BACKEND=docker, the suite above ran on docker hosts"
  exit "$rc"
fi
docker_rc=0
scripts/test-docker.sh || docker_rc=$?
# The real-engine stage (scripts/test-real.sh): the tests marked `real` against vLLM's CPU
# build on sandbox hosts (its packages cached after the first run; skipped with pip's
# reason where they cannot be had).
real_rc=0
scripts/test-real.sh || real_rc=$?
echo "== scripts/test.sh: pytest exit $rc, docker stage exit $docker_rc, real-engine stage exit $real_rc"
[ "$rc" != 0 ] && exit "$rc"
[ "$docker_rc" != 0 ] && exit "$docker_rc"
exit "$real_rc"
