#!/bin/sh
# Plain OpenSSH drivers of the peers benchmark, as a shell user writes them:
#
#   ssh_run.sh floor HOSTS OUT SCRIPT [ARG...]   one ssh per host: SCRIPT (a sh script)
#                                                 runs remotely as `sh -s -- PY PKG ARG...`
#   ssh_run.sh steps HOSTS OUT                    the facts, one ssh per step, in turn
#
# HOSTS has one line per host: NAME ADDRESS PORT PYTHON PKG (PKG: vLLM's package dir,
# known from an earlier inspect). Every host runs at once (forks = N). OUT/NAME gets the
# host's output, OUT/NAME.rc its exit status. Environment: FB_USER, FB_KEY, FB_KNOWN_HOSTS,
# FB_WORK (the directory of the remote scripts).
set -u
mode=$1 hosts=$2 out=$3
shift 3
script=${1:-}
[ "$mode" = floor ] && shift

rssh() {  # rssh ADDRESS PORT COMMAND...
  a=$1 p=$2
  shift 2
  ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes \
    -o UserKnownHostsFile="$FB_KNOWN_HOSTS" -o IdentitiesOnly=yes -i "$FB_KEY" \
    -p "$p" -l "$FB_USER" "$a" "$@"
}

steps() {  # the facts, one ssh per step (PKG is learnt by the first step)
  a=$1 p=$2 py=$3
  loc=$(rssh "$a" "$p" "'$py' -" <"$FB_WORK/vllm_locate.py") || return 1
  printf '%s\n' "$loc"
  pkg=$(printf '%s' "$loc" | sed -n 's/.*"path": "\([^"]*\)".*/\1/p')
  rssh "$a" "$p" nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version \
    --format=csv,noheader,nounits || return 1
  rssh "$a" "$p" "'$py' - '$pkg'" <"$FB_WORK/eagle3_check.py" || return 1
  rssh "$a" "$p" sha256sum "'$pkg/model_executor/models/deepseek_v2.py'" || return 1
  rssh "$a" "$p" df -Pk '"$HOME"' "'$pkg'"
}

while read -r name addr port py pkg; do
  [ -n "$name" ] || continue
  if [ "$mode" = floor ]; then
    (rssh "$addr" "$port" sh -s -- "'$py'" "'$pkg'" "$@" <"$script" >"$out/$name" 2>&1
     echo $? >"$out/$name.rc") &
  else
    (steps "$addr" "$port" "$py" >"$out/$name" 2>&1
     echo $? >"$out/$name.rc") &
  fi
done <"$hosts"
wait
