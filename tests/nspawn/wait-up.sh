#!/usr/bin/env bash
# Wait until a guest started by start.sh has booted: its systemd reports running or degraded.
# With OLD_INIT (the host pid of the guest's init before a reboot), wait for the next boot instead.
#
# usage: wait-up.sh MACHINE [TIMEOUT_S [OLD_INIT]]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=SCRIPTDIR/common.sh
. "$here/common.sh"

machine=${1:?usage: wait-up.sh MACHINE [TIMEOUT_S [OLD_INIT]]}
timeout_s=${2:-90}
old=${3:-}
dir=$(nspawn_dir "$machine")
log=$(nspawn_log "$machine")
deadline=$((SECONDS + timeout_s))
state=
while [ "$SECONDS" -lt "$deadline" ]; do
  if leader=$(nspawn_leader "$machine") && [ "$leader" != "$old" ]; then
    # --wait returns once the boot is over; timeout guards against a guest that never gets there.
    state=$(timeout 10 nsenter --target "$leader" --mount --uts --ipc --net --pid -- \
      systemctl is-system-running --wait 2>/dev/null || true)
    case $state in
      running|degraded)
        echo "$machine: $state (init pid $leader on the host)"
        exit 0
        ;;
    esac
  elif [ "$SECONDS" -gt 5 ] && ! { [ -e "$dir/supervisor.pid" ] && kill -0 "$(cat "$dir/supervisor.pid")" 2>/dev/null; }; then
    echo "wait-up.sh: $machine is not running; the end of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  sleep 0.5
done
echo "wait-up.sh: $machine not up after ${timeout_s}s (last state: ${state:-none}); the end of $log:" >&2
tail -n 20 "$log" >&2
exit 1
