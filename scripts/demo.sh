#!/usr/bin/env bash
# The demo: a sandbox fleet on this machine (real sshd hosts with the real vLLM source of
# two versions), then fleet's main job on it. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
DIR=${FLEET_DEMO_DIR:-.sandbox/demo}
INV="$DIR/inventory.yaml"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { step "$@"; "$@" || echo "(exit code $?)"; }
# A command whose exit code 1 is the point (a diagnosis that found the problem).
run_finds() { step "$@"; "$@" && echo "(nothing found?)" || echo "(exit code $?: a problem was found, as expected)"; }

fleet sandbox down --dir "$DIR" >/dev/null 2>&1 || true
run fleet sandbox up --hosts 3 --vllm 0.17.0 --vllm 0.18.0 --dir "$DIR"
run fleet --inventory "$INV" ping --host all
run fleet --inventory "$INV" inspect --host all
run fleet --inventory "$INV" source grep --host sandbox-01 'class DeepseekV2ForCausalLM' model_executor/models/deepseek_v2.py

# What a 40-minute load of Kimi-K2.5 + EAGLE-3 on vLLM 0.17 ends with, diagnosed:
run_finds fleet logs --file tests/corpus/logs/eagle3-unsupported-model--eagle3-runner--v1.log --diagnose

# The fix: the version-aware EAGLE-3 patch set (0.17 hosts patched, 0.18 left alone).
run fleet --inventory "$INV" patch --host all --check
run fleet --inventory "$INV" patch --host all
run fleet --inventory "$INV" patch --host all          # again: nothing changes
run fleet --inventory "$INV" inspect --host all        # EAGLE-3 supported everywhere now

printf '\nThe sandbox is still up. Try more commands with --inventory %s\n(e.g. fleet patch --host all --revert), and stop it with:\n  fleet sandbox down --dir %s\n' "$INV" "$DIR"
