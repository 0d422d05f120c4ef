#!/usr/bin/env bash
# Ansible's shell executable for a guest started by start.sh (ansible_shell_executable, with
# ansible_connection=local): start.sh links it as $GPUFLEET_NSPAWN_HOME/machines/MACHINE/sh, and
# "<that link> -c CMD" runs CMD with /bin/sh inside MACHINE - its mount, pid, network, ipc and uts
# namespaces, a clean environment - so every path in CMD (interpreters, the role's venv) is the
# guest's. Ansible copies module files into its remote tmp, which start.sh binds at the same path.
#
# The file is also bound into the guest at the link's path, because modules run their shell
# commands through the shell executable Ansible hands them; there it just runs /bin/sh.
set -euo pipefail
machine=$(basename "$(dirname "$0")")
if [ -e /run/systemd/container ] && [ "$(uname -n)" = "$machine" ]; then
  exec /bin/sh "$@"
fi
here=$(dirname "$(realpath "$0")")
# shellcheck source=SCRIPTDIR/common.sh
. "$here/common.sh"
if ! leader=$(nspawn_leader "$machine"); then
  echo "$0: the guest $machine is not running" >&2
  exit 1
fi
exec nsenter --target "$leader" --mount --uts --ipc --net --pid --root --wd -- \
  /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  USER=root LOGNAME=root LANG=C.UTF-8 /bin/sh "$@"
