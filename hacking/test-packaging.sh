#!/usr/bin/env bash
# Build the collection tarball, check it holds no development artefacts, install it into an empty
# collections path and run the modules by FQCN from the installed copy against a simulated host.
# usage: test-packaging.sh SIMHOST_LIBDIR PYTHON
set -euo pipefail

libdir=${1:?usage: test-packaging.sh SIMHOST_LIBDIR PYTHON}
python=${2:?PYTHON missing}
bindir=$(dirname "$python")
repo=$(git rev-parse --show-toplevel)
work=$(mktemp -d /tmp/gfpkg.XXXXXX)
chmod 0755 "$work"
# Whatever happened, nothing of this run's simulated host keeps running. Its processes run as
# `python <checkout>/tests/fakes/...`: the command line does not name $work, their environment does.
cleanup() {
  "$python" "$repo/hacking/leftovers.py" --kill "$work"
  rm -rf "$work"
}
trap cleanup EXIT

# Build from a clean export of the tracked (and new, not ignored) files plus the dev artefacts a
# developer's checkout has, so build_ignore is what keeps them out.
src="$work/src"
mkdir -p "$src"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' path; do [ -e "$path" ] && printf '%s\0' "$path"; done \
  | tar --null --no-recursion -T - -cf -) | tar -xf - -C "$src"
mkdir -p "$src/.venv/bin" "$src/.simhost/lib" "$src/tests/output/junit" "$src/plugins/modules/__pycache__" "$src/.pytest_cache"
touch "$src/.venv/bin/python" "$src/.simhost/lib/libnvidia-ml.so.1" "$src/tests/output/junit/x.xml" \
  "$src/plugins/modules/__pycache__/mps_daemon.cpython-311.pyc" "$src/.pytest_cache/x"

"$bindir/ansible-galaxy" collection build --output-path "$work/dist" "$src" >/dev/null
tarball=$(ls "$work"/dist/gpufleet-mps-*.tar.gz)
listing=$(tar -tzf "$tarball")
echo "built $(basename "$tarball") ($(du -k "$tarball" | cut -f1) KiB, $(echo "$listing" | wc -l) entries)"
bad=$(echo "$listing" | grep -E '(^|/)(\.venv|\.simhost|\.ansible|\.pytest_cache|__pycache__|\.git)(/|$)|^tests/output/|\.pyc$|\.so(\.[0-9]+)*$|\.tar\.gz$' || true)
if [ -n "$bad" ]; then
  echo "test-packaging: the tarball holds development artefacts:" >&2
  echo "$bad" >&2
  exit 1
fi
for needed in MANIFEST.json FILES.json plugins/modules/mps_daemon.py plugins/modules/mps_limits.py \
  plugins/modules/mps_info.py roles/fleet/tasks/main.yml meta/runtime.yml meta/execution-environment.yml; do
  grep -qx "$needed" <<< "$listing" || { echo "test-packaging: $needed missing from the tarball" >&2; exit 1; }
done

ANSIBLE_COLLECTIONS_PATH="$work/collections" "$bindir/ansible-galaxy" collection install --force -p "$work/collections" "$tarball" >/dev/null
"$repo/tests/fakes/make-simhost.sh" "$work/host" "$libdir" "$python" >/dev/null

cat > "$work/play.yml" <<PLAY
- name: The installed collection on a simulated host
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: $python
  environment:
    FAKE_NVML_CONFIG: $work/host/nvml.ini
    LD_LIBRARY_PATH: $work/host/lib
  module_defaults:
    group/gpufleet.mps.mps:
      root: $work/root
      config_dir: $work/etc
      control_binary: $work/host/bin/nvidia-cuda-mps-control
  tasks:
    - name: Limits first
      gpufleet.mps.mps_limits:
        name: pkg
        replicas: 4
        create: true
    - name: Then the daemon
      gpufleet.mps.mps_daemon:
        name: pkg
        supervisor: none
        stop_timeout: 5
      register: daemon
    - name: Facts
      gpufleet.mps.mps_info:
        name: pkg
      register: info
    - name: It runs, healthy, with the limits
      ansible.builtin.assert:
        that:
          - daemon is changed
          - info.daemons[0].healthy
          - info.daemons[0].limits.reported.active_thread_percentage == 25.0
    - name: Stop
      gpufleet.mps.mps_daemon:
        name: pkg
        state: stopped
        stop_timeout: 5
PLAY
ANSIBLE_COLLECTIONS_PATH="$work/collections" ANSIBLE_NOCOLOR=1 \
  "$bindir/ansible-playbook" -i localhost, "$work/play.yml" > "$work/play.log" 2>&1 || { cat "$work/play.log"; exit 1; }
grep -q 'failed=0' "$work/play.log" || { cat "$work/play.log"; exit 1; }
echo "installed collection ran: $(grep -E 'localhost +:' "$work/play.log" | tr -s ' ')"
# The play stopped the daemon it started: fail, naming them, if anything of the simulated host still runs.
"$python" "$repo/hacking/leftovers.py" "$work"
