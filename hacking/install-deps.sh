#!/usr/bin/env bash
# Install the Debian packages the test suite needs, only those missing. Safe to run repeatedly.
#   the shellcheck package - so ansible-test's shellcheck sanity test really runs instead of skipping
#   gcc, make   - to build the fake libnvidia-ml.so.1
#   logrotate   - the fleet role's log rotation drop-in is checked with logrotate --debug
#   systemd-container, debootstrap, zstd, procps - the molecule systemd scenario boots a Debian guest
#               with systemd-nspawn (tests/nspawn/)
#   openssh-server - bench/fleetbench.py reaches its hosts over SSH too (an sshd of its own on 127.0.0.1,
#               started and stopped by the benchmark; the package's own service is not started here)
#   munge, slurmctld, slurmd, slurm-client, podman, runc, prometheus-node-exporter - make engines runs a real
#               one-node Slurm cluster, a podman container and a node_exporter against the simulated host, each
#               with a configuration of the test's own (their packaged services are not started here)
set -euo pipefail

declare -A need=(
  [shellcheck]=shellcheck
  [gcc]=gcc
  [make]=make
  [systemd-nspawn]=systemd-container
  [debootstrap]=debootstrap
  [zstd]=zstd
  [pgrep]=procps
  [logrotate]=logrotate
  [/usr/sbin/sshd]=openssh-server
  [munged]=munge
  [slurmctld]=slurmctld
  [slurmd]=slurmd
  [srun]=slurm-client
  [podman]=podman
  [runc]=runc
  [prometheus-node-exporter]=prometheus-node-exporter
)

missing=()
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps.sh: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
  exit 1
fi
echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Packages install, they do not start services (openssh-server's sshd on port 22): Debian's policy-rc.d
# convention, only while this script runs and only where the host has no policy of its own.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# gpufleet.mps install-deps.sh: no service starts while it installs packages\nexit 101\n' > "$policy"
  chmod 0755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
