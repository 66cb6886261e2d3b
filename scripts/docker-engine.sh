#!/usr/bin/env bash
# A Docker engine and the sandbox base image for fleet's docker-sshd rehearsal hosts.
#
#   scripts/docker-engine.sh [start]   install docker.io + debootstrap where missing, start
#                                      dockerd when no engine answers, build/cache the base
#                                      image; idempotent. Prints one summary line.
#   scripts/docker-engine.sh stop      stop the dockerd that `start` started (its recorded
#                                      pid, checked by start time); nothing else, never by name
#   scripts/docker-engine.sh status    one line: engine, who started it, base image
#
# Exit codes: 0 ready; 2 no engine can be had here (not root and no `sudo -n`, no package,
# no Debian mirror, FLEET_SKIP_DOCKER=1): one line on stderr says why; 1 anything else.
#
# Base image: `debootstrap --variant=minbase bookworm` (with the packages a host needs) into
# a temporary directory, packed as a rootfs tarball cached in ~/.cache/fleet/docker/ (or
# $FLEET_CACHE/docker/) and `docker import`ed as fleet-sandbox-base:bookworm with the hash of
# its inputs in a label. Nothing is pulled from a registry; a new tarball is built only when
# the inputs (suite, variant, packages, mirror) change.
#
# Mirror: the Debian mirror this machine's apt already uses (its sources files), or
# $FLEET_DEBIAN_MIRROR.
set -euo pipefail

SUITE=bookworm
VARIANT=minbase
# What a rehearsal host needs from Debian: sshd, a Python with venv, ps/pgrep, ss, the
# real supervisord, and systemd for the variant that boots it as PID 1 (the others start
# with their own init script). (tests/docker/Dockerfile adds the rest; one variant purges
# supervisor.)
PACKAGES=openssh-server,python3,python3-venv,procps,iproute2,supervisor,systemd,systemd-sysv,dbus
BASE_IMAGE=fleet-sandbox-base:$SUITE
BASE_LABEL=org.fleet.base-inputs

CACHE=${FLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleet}/docker
STATE=$CACHE/dockerd.state
LOG=$CACHE/dockerd.log
# Where a dockerd started here keeps its files: Docker's own defaults, so a developer's
# `docker` command sees the same engine (and the image cache survives between runs).
DATA_ROOT=/var/lib/docker
EXEC_ROOT=/var/run/docker
SOCKET=/var/run/docker.sock
PIDFILE=/var/run/docker.pid
START_TIMEOUT=60

say() { echo "docker-engine: $*" >&2; }
cannot() { say "$*"; exit 2; }
fail() { say "$*"; exit 1; }

# -- privilege ---------------------------------------------------------------------------
SUDO=()
need_root() {
  if [ "$(id -u)" = 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    cannot "$1 needs root (or passwordless sudo); run as root or install and start Docker yourself"
  fi
}
as_root() { "${SUDO[@]}" "$@"; }

# -- the engine --------------------------------------------------------------------------
engine_version() {
  # The server's version, or nothing when no engine answers.
  timeout 20 docker version --format '{{.Server.Version}}' 2>/dev/null || true
}

start_token() {
  # The kernel's start time of pid $1 (field 22 of /proc/PID/stat), or nothing.
  local stat rest
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  rest=${stat##*) }
  # shellcheck disable=SC2086
  set -- $rest
  case $1 in Z|X) return 0 ;; esac
  echo "${20}"
}

state_get() { sed -n "s/^$1=//p" "$STATE" 2>/dev/null | head -n 1; }

owned_pid() {
  # The pid of the dockerd this script started, if that very process still runs.
  local pid token
  [ -f "$STATE" ] || return 0
  pid=$(state_get pid)
  token=$(state_get start)
  case $pid in ''|*[!0-9]*) return 0 ;; esac
  if [ -n "$token" ] && [ "$(start_token "$pid")" = "$token" ]; then
    echo "$pid"
  fi
}

install_packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
  [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 \
    || cannot "no apt-get to install ${missing[*]}; install Docker Engine and debootstrap yourself"
  need_root "installing ${missing[*]}"
  say "installing ${missing[*]} (Debian packages)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
    || cannot "apt-get update failed; cannot install ${missing[*]}"
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}" >"$CACHE/apt.log" 2>&1; then
    cannot "apt-get install ${missing[*]} failed: $(tail -n 1 "$CACHE/apt.log")"
  fi
  command -v dockerd >/dev/null 2>&1 || cannot "docker.io installed no dockerd"
}

start_engine() {
  local version pid waited
  version=$(engine_version)
  if [ -n "$version" ]; then
    ENGINE_NOTE="engine $version already running"
    [ -n "$(owned_pid)" ] && ENGINE_NOTE="engine $version (started by this script, pid $(owned_pid))"
    return 0
  fi
  if [ -n "${DOCKER_HOST:-}" ]; then
    cannot "DOCKER_HOST=$DOCKER_HOST names an engine that does not answer"
  fi
  need_root "starting dockerd"
  command -v dockerd >/dev/null 2>&1 || cannot "no dockerd (install the docker.io package)"
  say "starting dockerd (log: $LOG)"
  # The socket's group is ours, so a non-root caller with sudo can use it.
  as_root dockerd \
      --data-root "$DATA_ROOT" --exec-root "$EXEC_ROOT" \
      -H "unix://$SOCKET" --pidfile "$PIDFILE" --group "$(id -gn)" --userland-proxy=false \
      </dev/null >"$LOG" 2>&1 9>&- &
  local launcher=$!
  waited=0
  while :; do
    version=$(engine_version)
    [ -n "$version" ] && break
    if ! kill -0 "$launcher" 2>/dev/null; then
      wait "$launcher" || true
      fail "dockerd exited: $(grep -iE 'level=(fatal|error)|failed' "$LOG" | tail -n 1 || tail -n 1 "$LOG")"
    fi
    if [ "$waited" -ge $((START_TIMEOUT * 5)) ]; then
      fail "dockerd did not answer within ${START_TIMEOUT}s (log: $LOG)"
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  pid=$(as_root cat "$PIDFILE" 2>/dev/null || true)
  case $pid in ''|*[!0-9]*) pid=$launcher ;; esac
  {
    echo "pid=$pid"
    echo "start=$(start_token "$pid")"
    echo "launcher=$launcher"
    echo "data_root=$DATA_ROOT"
    echo "exec_root=$EXEC_ROOT"
    echo "socket=unix://$SOCKET"
    echo "log=$LOG"
    echo "sudo=${SUDO[*]}"
  } >"$STATE.tmp"
  mv "$STATE.tmp" "$STATE"
  ENGINE_NOTE="engine $version (started, pid $pid, $(docker info --format '{{.Driver}}' 2>/dev/null))"
}

stop_engine() {
  local pid sudo_word
  pid=$(owned_pid)
  if [ -z "$pid" ]; then
    [ -f "$STATE" ] && rm -f "$STATE"
    say "no dockerd started by this script is running; nothing to stop"
    return 0
  fi
  sudo_word=$(state_get sudo)
  SUDO=()
  [ -n "$sudo_word" ] && SUDO=(sudo -n)
  as_root kill -TERM "$pid" 2>/dev/null || true
  local _
  for _ in $(seq 1 150); do
    [ "$(start_token "$pid")" = "$(state_get start)" ] || break
    sleep 0.2
  done
  if [ "$(start_token "$pid")" = "$(state_get start)" ]; then
    say "dockerd (pid $pid) ignored SIGTERM for 30s; sending SIGKILL"
    as_root kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$STATE"
  say "stopped dockerd (pid $pid)"
}

# -- the base image ----------------------------------------------------------------------
debian_mirror() {
  # The first Debian archive URI apt uses for $SUITE (one-line or deb822 sources).
  if [ -n "${FLEET_DEBIAN_MIRROR:-}" ]; then
    echo "$FLEET_DEBIAN_MIRROR"
    return 0
  fi
  local files=()
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  local f
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -eq 0 ] && return 0
  awk -v suite="$SUITE" '
    function flush() {
      if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && uris != "") {
        split(uris, u, " "); print u[1]; found = 1; exit
      }
      types = ""; uris = ""; suites = ""
    }
    FNR == 1 { flush() }
    /^[ \t]*#/ { next }
    /^deb[ \t]/ {
      line = $0; sub(/\[[^]]*\]/, "", line); n = split(line, w, /[ \t]+/)
      if (w[3] == suite) { print w[2]; found = 1; exit }
      next
    }
    /^[ \t]*$/ { flush(); next }
    /^Types:/ { sub(/^Types:[ \t]*/, ""); types = $0 }
    /^URIs:/ { sub(/^URIs:[ \t]*/, ""); uris = $0 }
    /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
    END { if (!found) flush() }
  ' "${files[@]}"
}

base_image_label() {
  docker image inspect --format "{{ index .Config.Labels \"$BASE_LABEL\" }}" "$BASE_IMAGE" \
    2>/dev/null || true
}

build_base() {
  local mirror key tarball tmp
  mirror=$(debian_mirror)
  [ -n "$mirror" ] || cannot "no Debian $SUITE mirror in apt's sources; set FLEET_DEBIAN_MIRROR"
  key=$(printf '%s\n' "$SUITE" "$VARIANT" "$PACKAGES" "$mirror" "$(uname -m)" \
        | sha256sum | cut -c1-16)
  if [ "$(base_image_label)" = "$key" ]; then
    BASE_NOTE="base image $BASE_IMAGE cached ($(docker image inspect -f '{{.Id}}' "$BASE_IMAGE" | cut -c8-19))"
    return 0
  fi
  tarball=$CACHE/rootfs-$SUITE-$VARIANT-$key.tar
  if [ ! -s "$tarball" ]; then
    need_root "debootstrap"
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] \
      || cannot "no debootstrap (install the debootstrap package)"
    tmp=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    # shellcheck disable=SC2064
    trap "as_root rm -rf '$tmp'" EXIT
    say "debootstrap --variant=$VARIANT $SUITE (first run only; log: $CACHE/debootstrap.log)"
    if ! as_root debootstrap --variant="$VARIANT" --include="$PACKAGES" \
        "$SUITE" "$tmp/root" "$mirror" >"$CACHE/debootstrap.log" 2>&1; then
      fail "debootstrap failed: $(tail -n 1 "$CACHE/debootstrap.log")"
    fi
    # No downloaded .debs, apt lists or host keys in the image.
    # shellcheck disable=SC2016  # $1 is expanded by that sh
    as_root sh -c 'rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* \
                          "$1"/etc/ssh/ssh_host_*' sh "$tmp/root"
    as_root tar -C "$tmp/root" --numeric-owner -cf "$tmp/rootfs.tar" .
    as_root chown "$(id -u):$(id -g)" "$tmp/rootfs.tar"
    mv "$tmp/rootfs.tar" "$tarball"
    as_root rm -rf "$tmp"
    trap - EXIT
    # Tarballs of older inputs are no longer needed.
    find "$CACHE" -maxdepth 1 -name "rootfs-$SUITE-*.tar" ! -name "$(basename "$tarball")" \
      -delete
  fi
  say "importing $BASE_IMAGE from $(basename "$tarball")"
  docker import \
      --change "LABEL $BASE_LABEL=$key" \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' \
      "$tarball" "$BASE_IMAGE" >/dev/null \
    || fail "docker import of $tarball failed"
  BASE_NOTE="base image $BASE_IMAGE built ($(docker image inspect -f '{{.Id}}' "$BASE_IMAGE" | cut -c8-19))"
}

# -- commands ----------------------------------------------------------------------------
if ! mkdir -p "$CACHE" 2>/dev/null; then  # e.g. a HOME that cannot be written
  CACHE=${TMPDIR:-/tmp}/fleet-$(id -u)/docker
  STATE=$CACHE/dockerd.state
  LOG=$CACHE/dockerd.log
  mkdir -p "$CACHE"
fi
cmd=${1:-start}
case $cmd in
  start)
    if [ "${FLEET_SKIP_DOCKER:-0}" = 1 ]; then
      cannot "FLEET_SKIP_DOCKER=1"
    fi
    (
      flock 9
      ENGINE_NOTE="" BASE_NOTE=""
      install_packages
      start_engine
      build_base
      echo "docker-engine: ready: $ENGINE_NOTE; $BASE_NOTE"
    ) 9>"$CACHE/engine.lock"
    ;;
  stop)
    (
      flock 9
      stop_engine
    ) 9>"$CACHE/engine.lock"
    ;;
  status)
    version=$(engine_version)
    if [ -z "$version" ]; then
      echo "docker-engine: no engine answers"
      exit 1
    fi
    owner="not started by this script"
    [ -n "$(owned_pid)" ] && owner="started by this script, pid $(owned_pid)"
    base=$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE" 2>/dev/null | cut -c8-19 || true)
    echo "docker-engine: engine $version ($owner); $BASE_IMAGE ${base:-missing}"
    ;;
  *)
    say "unknown command '$cmd' (expected start, stop or status)"
    exit 2
    ;;
esac
