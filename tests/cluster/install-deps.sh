#!/usr/bin/env bash
# install-deps.sh - install the Debian 12 packages the Slurm sandbox (tests/cluster/sandbox.sh) needs.
#
# Idempotent: exits within a fraction of a second when every package is already installed.
# Runs `apt-get update` only when the package lists are missing or the install fails with them.
# Needs root (CI runs it as root on a fresh Debian 12 machine).
set -euo pipefail

PKGS=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server
      openmpi-bin libopenmpi-dev libpmix-dev iproute2 util-linux bc
      openssh-server openssh-client rsync)  # the login node of the --remote tests (tests/cluster/login_node.py)

log() { echo "[install-deps $(date +%T)] $*" >&2; }

missing=()
for p in "${PKGS[@]}"; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  log "all ${#PKGS[@]} packages already installed"
  exit 0
fi
[ "$(id -u)" = 0 ] || { log "ERROR: must run as root to install: ${missing[*]}"; exit 1; }
log "missing: ${missing[*]}"

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-y --no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
# dpkg syncs each file it unpacks to disk (not measured here: this machine's packages are installed); these are
# a test machine's packages, and an install cut off half-way is finished by `dpkg --configure -a` (below) or,
# on a machine that crashed, done again
APT_OPTS+=(-o Dpkg::Options::=--force-unsafe-io)
# a stalled mirror or another apt holding the lock (a fresh machine's own upgrade) fails within minutes, not never
APT_NET=(-o Acquire::Retries=3 -o Acquire::http::Timeout=60 -o Acquire::https::Timeout=60 -o DPkg::Lock::Timeout=300)
APT_OPTS+=("${APT_NET[@]}")
# an install stopped half-way (make test's set-up limit) leaves dpkg asking for this before anything else
if [ -n "$(dpkg --audit 2>/dev/null)" ]; then
  log "dpkg was interrupted: dpkg --configure -a"
  dpkg --configure -a
fi

lists_present() { compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; }

updated=0
if ! lists_present; then
  log "apt-get update (no package lists)"
  apt-get update -q "${APT_NET[@]}"
  updated=1
fi
if ! apt-get install "${APT_OPTS[@]}" "${PKGS[@]}"; then
  [ $updated = 1 ] && exit 1
  log "install failed; apt-get update and retry"
  apt-get update -q "${APT_NET[@]}"
  apt-get install "${APT_OPTS[@]}" "${PKGS[@]}"
fi
log "done"
