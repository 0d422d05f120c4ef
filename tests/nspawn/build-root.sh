#!/usr/bin/env bash
# Lay out a bootable Debian root file system for systemd-nspawn --boot in DEST (absent or empty).
# The first run debootstraps it (about two minutes) and caches it as a tarball under
# $GPUFLEET_NSPAWN_HOME/cache, keyed by suite and package set; later runs only unpack the tarball.
# The guest keeps its apt lists, like a host that has run apt-get update, so roles can install
# packages; a tarball older than NSPAWN_CACHE_DAYS is rebuilt before its lists go stale.
#
# usage: build-root.sh DEST
#   NSPAWN_SUITE (default bookworm), DEBIAN_MIRROR (default http://deb.debian.org/debian),
#   NSPAWN_CACHE_DAYS (default 14)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=SCRIPTDIR/common.sh
. "$here/common.sh"

dest=${1:?usage: build-root.sh DEST}
suite=${NSPAWN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# systemd as PID 1; python3 for Ansible; python3-venv for the fleet role's own virtual environment;
# python3-apt for ansible.builtin.package; procps (kill, ps) as on any real host.
packages=systemd,systemd-sysv,dbus,python3,python3-venv,python3-apt,procps
# Bump when the layout below changes, so cached tarballs of the old layout are not reused.
layout=2
key=$(printf '%s %s %s\n' "$suite" "$packages" "$layout" | sha256sum | cut -c1-12)
cache=$(nspawn_cache)/debian-$suite-$key.tar.zst
max_age=${NSPAWN_CACHE_DAYS:-14}

if [ -e "$dest" ] && [ -n "$(ls -A "$dest")" ]; then
  echo "build-root.sh: $dest exists and is not empty" >&2
  exit 1
fi

mkdir -p "$(nspawn_cache)"
exec 9> "$(nspawn_cache)/.lock"
flock 9                                   # one debootstrap at a time; the others wait and reuse it
if [ -f "$cache" ] && [ -n "$(find "$cache" -mtime +"$max_age")" ]; then
  echo "build-root.sh: $cache is older than $max_age days; building it again"
  rm -f "$cache"
fi
if [ ! -f "$cache" ]; then
  work=$(mktemp -d "$(nspawn_cache)/debootstrap.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  chmod 0755 "$work"                      # mktemp makes 0700; a guest root must be 0755
  echo "build-root.sh: debootstrap $suite ($packages) - cached as $cache"
  debootstrap --variant=minbase --include="$packages" "$suite" "$work" "$mirror" > "$work.log" 2>&1 || {
    tail -n 30 "$work.log" >&2; rm -f "$work.log"; exit 1; }
  rm -f "$work.log"
  rm -f "$work/etc/hostname"              # else the host's name wins over --machine
  : > "$work/etc/machine-id"              # empty: a fresh id on every boot
  rm -f "$work"/var/cache/apt/archives/*.deb
  tar -C "$work" --numeric-owner --xattrs --acls -cpf - . | zstd -q -T0 -o "$cache.tmp"
  mv -f "$cache.tmp" "$cache"
fi
exec 9>&-

mkdir -p "$dest"
chmod 0755 "$dest"
tar -C "$dest" --numeric-owner --xattrs --acls -I zstd -xpf "$cache"
