# shellcheck shell=bash
# Sourced by the tests/nspawn scripts: where a guest's state lives and how to reach its init.
#
#   $GPUFLEET_NSPAWN_HOME (default /var/tmp/gpufleet-nspawn)
#     cache/                  debootstrapped root file systems, one tarball per package set
#     logs/MACHINE.log        the guest's console, kept after the guest is gone
#     machines/MACHINE/       everything else of one guest, removed by stop.sh --purge:
#       root/                 its root file system
#       ansible-tmp/          Ansible's remote tmp, bind-mounted into the guest at the same path
#       sh                    Ansible's shell executable for the guest (a link to sh-wrapper.sh)
#       nspawn.pid supervisor.pid stop        run state of start.sh and stop.sh

nspawn_home=${GPUFLEET_NSPAWN_HOME:-/var/tmp/gpufleet-nspawn}

# nspawn_dir MACHINE - the guest's state directory
nspawn_dir() {
  printf '%s/machines/%s\n' "$nspawn_home" "$1"
}

# nspawn_log MACHINE - the guest's console log
nspawn_log() {
  printf '%s/logs/%s.log\n' "$nspawn_home" "$1"
}

# nspawn_cache - the directory of the cached root file system tarballs
nspawn_cache() {
  printf '%s/cache\n' "$nspawn_home"
}

# nspawn_leader MACHINE - pid (host view) of the guest's init; fails when the guest is not running.
# systemd-nspawn's only child is the guest's PID 1.
nspawn_leader() {
  local pid
  pid=$(cat "$(nspawn_dir "$1")/nspawn.pid" 2>/dev/null) || return 1
  pgrep -o -P "$pid"
}

# nspawn_cgroups MACHINE - the host cgroups start.sh puts a guest in (one per writable hierarchy
# that systemd in the guest uses: name=systemd and the unified one on a hybrid host, else cgroup2).
nspawn_cgroups() {
  local fs=/sys/fs/cgroup
  if [ -d "$fs/unified" ] || [ -d "$fs/systemd" ]; then
    for h in systemd unified; do
      if [ -d "$fs/$h" ]; then printf '%s/%s/gpufleet-nspawn-%s\n' "$fs" "$h" "$1"; fi
    done
  else
    printf '%s/gpufleet-nspawn-%s\n' "$fs" "$1"
  fi
}
