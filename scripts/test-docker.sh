#!/usr/bin/env bash
# The docker stage: the integration tests marked `docker`, run against docker-sshd
# rehearsal hosts (FLEET_SANDBOX_BACKEND=docker).
#   scripts/test-docker.sh                      the marked tests in tests/integration
#   scripts/test-docker.sh -k patch             extra arguments go to pytest
# Starts a Docker engine with scripts/docker-engine.sh when none answers (installing
# docker.io and debootstrap, building the base image), and stops the engine it started, and
# only that one, when it ends. Where no engine can be had (not root, no package), the stage
# is skipped with one line saying why, and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/bootstrap.sh

stage_start=$(date +%s)
echo "== docker stage"
owned=0
if ! scripts/docker-engine.sh status >/dev/null 2>&1; then
  owned=1  # no engine answers yet: the one started now is this run's to stop
fi
# shellcheck disable=SC2317  # run by the EXIT trap
stop_engine() {
  if [ "$owned" = 1 ]; then
    scripts/docker-engine.sh stop || true
  fi
}
trap stop_engine EXIT

engine_log=$(mktemp)
set +e
( scripts/docker-engine.sh start 2>&1 1>&3 3>&- | tee "$engine_log" >&2
  exit "${PIPESTATUS[0]}" ) 3>&1
rc=$?
set -e
reason=$({ grep '^docker-engine: ' "$engine_log" || true; } | tail -n 1 | sed 's/^docker-engine: //')
rm -f "$engine_log"
if [ "$rc" = 2 ]; then
  owned=0  # nothing was started
  echo "== docker stage SKIPPED: ${reason:-no Docker engine can be had here}"
  exit 0
fi
if [ "$rc" != 0 ]; then
  echo "== docker stage FAILED: no Docker engine: ${reason:-see above}" >&2
  exit "$rc"
fi
engine_ready=$(date +%s)

# What fleet made (its label is only read here, to list; fleet acts by recorded ids).
fleet_objects() {
  docker ps -a -q --no-trunc --filter label=org.fleet.sandbox | sed 's/^/container /'
  docker network ls -q --no-trunc --filter label=org.fleet.sandbox | sed 's/^/network /'
}
before=$(fleet_objects | sort)

set +e
FLEET_SANDBOX_BACKEND=docker .venv/bin/python -m pytest -m docker "${@:-tests/integration}"
rc=$?
set -e
end=$(date +%s)

echo "== docker ps -a after the docker stage"
docker ps -a
left=$(comm -13 <(echo "$before") <(fleet_objects | sort) | sed '/^$/d')
if [ -n "$left" ]; then
  echo "== docker stage FAILED: the tests left behind: $(tr '\n' ' ' <<<"$left")" >&2
  [ "$rc" != 0 ] || rc=1
else
  echo "== no fleet containers or networks left behind"
fi
echo "== docker stage: pytest exit $rc; wall time $((end - stage_start))s" \
     "(engine and base image $((engine_ready - stage_start))s, tests $((end - engine_ready))s)"
exit "$rc"
