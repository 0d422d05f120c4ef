#!/usr/bin/env bash
# Reboot a guest started by start.sh from the inside (systemctl reboot: its systemd stops every unit,
# systemd-nspawn exits 133 and start.sh boots it again) and wait for the new boot to be up.
# (ansible.builtin.reboot refuses the local connection the guest is reached with.)
#
# usage: reboot.sh MACHINE [TIMEOUT_S]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=SCRIPTDIR/common.sh
. "$here/common.sh"

machine=${1:?usage: reboot.sh MACHINE [TIMEOUT_S]}
if ! old=$(nspawn_leader "$machine"); then
  echo "reboot.sh: $machine is not running" >&2
  exit 1
fi
# systemctl returns once the reboot job is queued; the shutdown may kill it first, which is fine:
# wait-up.sh fails unless a new init comes up.
nsenter --target "$old" --mount --uts --ipc --net --pid -- systemctl reboot || true
exec "$here/wait-up.sh" "$machine" "${2:-120}" "$old"
