#!/usr/bin/env bash
# The demo: a sandbox fleet on this machine (real sshd hosts holding the real vLLM 0.17.0
# source, the rehearsal vLLM and 8 simulated B200s each), then fleet's main job on it:
# serve Kimi-K2.5 with its EAGLE-3 drafter. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
DIR=${FLEET_DEMO_DIR:-.sandbox/demo}
INV="$DIR/inventory.yaml"
LOAD=${FLEET_DEMO_LOAD_SECONDS:-20}

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { step "$@"; "$@" || echo "(exit code $?)"; }
# A command whose exit code 1 is the point (a refusal or a diagnosed crash).
run_finds() { step "$@"; "$@" && echo "(nothing found?)" || echo "(exit code $?: as expected)"; }

fleet sandbox down --dir "$DIR" >/dev/null 2>&1 || true
run fleet sandbox up --hosts 2 --vllm 0.17.0 --load-seconds "$LOAD" --dir "$DIR"
run fleet --inventory "$INV" inspect --host all

# 1. On vLLM 0.17 the EAGLE-3 crash is predicted in seconds, not after a 40-minute load.
run_finds fleet --inventory "$INV" serve kimi-eagle3 --host all

# 2. The fix it names: the version-aware EAGLE-3 patch set.
run fleet --inventory "$INV" patch --host all

# 3. Serve for real: the (compressed) load followed to ready, then the acceptance rate.
run fleet --inventory "$INV" serve kimi-eagle3 --host all
run fleet --inventory "$INV" status --host all
run fleet --inventory "$INV" stop kimi-eagle3 --host all
run fleet --inventory "$INV" stop kimi-eagle3 --host all      # again: already stopped

# 4. Without the patch and without preflight: the crash vLLM really gives, diagnosed.
run fleet --inventory "$INV" patch --host sandbox-02 --revert
run_finds fleet --inventory "$INV" serve kimi-eagle3 --host sandbox-02 --skip-preflight

printf '\nThe sandbox is still up. Try more commands with --inventory %s\n(e.g. fleet logs --host sandbox-01 kimi-eagle3 --diagnose), and stop it with:\n  fleet sandbox down --dir %s\n' "$INV" "$DIR"
