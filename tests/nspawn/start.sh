#!/usr/bin/env bash
# Boot a guest made by build-root.sh: systemd-nspawn --boot of $GPUFLEET_NSPAWN_HOME/machines/MACHINE/root,
# in the background and in its own cgroups (the host has no systemd to give it a scope), booted again
# whenever the guest reboots (systemd-nspawn exits 133), until stop.sh. Returns once the guest's
# systemd reports running (or degraded).
#
# usage: start.sh MACHINE [SYSTEMD-NSPAWN-OPTION...]
#   e.g. --bind-ro=/etc/pip.conf (a host path, bound at the same path in the guest)
# Always bound: the guest's Ansible remote tmp and its shell executable (see sh-wrapper.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=SCRIPTDIR/common.sh
. "$here/common.sh"

if [ "${1:-}" = --supervise ]; then
  machine=$2
  shift 2
  dir=$(nspawn_dir "$machine")
  echo "$BASHPID" > "$dir/supervisor.pid"
  while read -r cgroup; do
    mkdir -p "$cgroup"
    echo "$BASHPID" > "$cgroup/cgroup.procs"
  done < <(nspawn_cgroups "$machine")
  while :; do
    systemd-nspawn --boot --directory="$dir/root" --machine="$machine" --register=no --keep-unit \
      --console=read-only --bind="$dir/ansible-tmp" --bind-ro="$here/sh-wrapper.sh:$dir/sh" "$@" &
    echo $! > "$dir/nspawn.pid"
    rc=0
    wait $! || rc=$?
    echo "start.sh: systemd-nspawn exited with status $rc"
    if [ "$rc" -ne 133 ] || [ -e "$dir/stop" ]; then break; fi
  done
  rm -f "$dir/nspawn.pid" "$dir/supervisor.pid"
  exit 0
fi

machine=${1:?usage: start.sh MACHINE [SYSTEMD-NSPAWN-OPTION...]}
shift
dir=$(nspawn_dir "$machine")
if [ ! -d "$dir/root" ]; then
  echo "start.sh: no root file system in $dir/root (build-root.sh makes one)" >&2
  exit 1
fi
if [ -e "$dir/supervisor.pid" ] && kill -0 "$(cat "$dir/supervisor.pid")" 2>/dev/null; then
  echo "start.sh: $machine is already running (stop.sh stops it)" >&2
  exit 1
fi
log=$(nspawn_log "$machine")
mkdir -p "$dir/ansible-tmp" "$(dirname "$log")"
rm -f "$dir/stop" "$dir/nspawn.pid" "$dir/supervisor.pid"
ln -sfn "$here/sh-wrapper.sh" "$dir/sh"
: > "$log"
setsid -f "$here/start.sh" --supervise "$machine" "$@" < /dev/null >> "$log" 2>&1
exec "$here/wait-up.sh" "$machine"
