#!/usr/bin/env bash
# Shut a guest started by start.sh down cleanly (SIGTERM to systemd-nspawn halts the guest), kill
# whatever is left in its cgroups, remove those cgroups and systemd-nspawn's leftovers on the host.
# With --purge, also remove the guest's state directory (root file system included); the cached
# tarball and the console log stay. Safe to run when the guest is not running, or never existed.
#
# usage: stop.sh MACHINE [--purge]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=SCRIPTDIR/common.sh
. "$here/common.sh"

machine=${1:?usage: stop.sh MACHINE [--purge]}
purge=${2:-}
dir=$(nspawn_dir "$machine")

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
wait_gone() {  # PID TENTHS_OF_A_SECOND
  local i
  for ((i = 0; i < $2; i++)); do alive "$1" || return 0; sleep 0.1; done
  ! alive "$1"
}

if [ -d "$dir" ]; then
  touch "$dir/stop"                       # start.sh's loop must not boot it again
  nspawn=$(cat "$dir/nspawn.pid" 2>/dev/null || true)
  supervisor=$(cat "$dir/supervisor.pid" 2>/dev/null || true)
  if alive "$nspawn"; then
    kill -TERM "$nspawn"                  # systemd-nspawn asks the guest's systemd to halt
    wait_gone "$nspawn" 300 || { echo "stop.sh: $machine did not halt in 30s; killing it" >&2; kill -KILL "$nspawn" 2>/dev/null || true; }
  fi
  if alive "$supervisor" && ! wait_gone "$supervisor" 50; then kill -KILL "$supervisor" 2>/dev/null || true; fi
fi

# Whatever is still in the guest's cgroups (a killed systemd-nspawn leaves its guest behind) dies,
# then the cgroups go, deepest first.
while read -r cgroup; do
  [ -d "$cgroup" ] || continue
  for _ in $(seq 50); do
    pids=$(find "$cgroup" -name cgroup.procs -exec cat {} + 2>/dev/null || true)
    [ -z "$pids" ] && break
    # shellcheck disable=SC2086 # one pid per word
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
  done
  for _ in $(seq 50); do
    find "$cgroup" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ -d "$cgroup" ] || break
    sleep 0.2
  done
  if [ -d "$cgroup" ]; then echo "stop.sh: could not remove $cgroup" >&2; exit 1; fi
done < <(nspawn_cgroups "$machine")

# systemd-nspawn's own state on the host: the mount propagation directory and the image lock.
rm -rf "/run/systemd/nspawn/propagate/$machine"
if [ -d "$dir/root" ]; then
  rm -f "/run/systemd/nspawn/locks/inode-$(stat -c '%d:%i' "$dir/root")"
fi

if [ "$purge" = --purge ] && [ -d "$dir" ]; then
  if grep -qF " $dir/" /proc/self/mountinfo; then
    echo "stop.sh: something is still mounted under $dir; not removing it" >&2
    exit 1
  fi
  rm -rf "$dir"
elif [ -d "$dir" ]; then
  rm -f "$dir/stop" "$dir/nspawn.pid" "$dir/supervisor.pid"
fi
