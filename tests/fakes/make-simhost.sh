#!/usr/bin/env bash
# Lay out a simulated GPU host in DEST (see tests/fakes/README.md):
#   DEST/bin/nvidia-cuda-mps-control  the MPS simulator      DEST/lib/libnvidia-ml.so.1  the fake NVML
#   DEST/bin/mps-sim-client           the CUDA client stand-in DEST/nvml.ini            this host's GPUs
#   DEST/bin/nvidia-smi               a minimal nvidia-smi     DEST/env                 . DEST/env to use it
# The wrappers carry the host's FAKE_NVML_CONFIG and library path themselves, because the modules
# start the daemon with a minimal environment, as on a real host. FAKE_MPS_* switches for the
# simulator go in DEST/mps.env (sourced by the wrapper when present).
#
# usage: make-simhost.sh DEST LIBDIR PYTHON [CONFIG]
#   LIBDIR  directory holding the built libnvidia-ml.so.1
#   PYTHON  interpreter with nvidia-ml-py (the repository's .venv/bin/python)
#   CONFIG  GPU set to copy (default: nvml/configs/h100x4.ini); an existing DEST/nvml.ini is kept
set -euo pipefail

dest=${1:?usage: make-simhost.sh DEST LIBDIR PYTHON [CONFIG]}
libdir=${2:?LIBDIR missing}
python=${3:?PYTHON missing}
fakes=$(cd "$(dirname "$0")" && pwd)
config=${4:-$fakes/nvml/configs/h100x4.ini}
# The wrappers name the interpreter by an absolute path: they run from any directory, under the modules' minimal
# environment and over SSH (a relative path, or a bare name found on this shell's PATH, would not be found there).
# An absolute path is taken as given: it may name an interpreter created later (the role's venv, in a guest).
case "$python" in
  /*) ;;
  */*) python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")" ;;
  *) python=$(command -v "$python") || { echo "make-simhost.sh: $3 is not on PATH" >&2; exit 2; } ;;
esac

mkdir -p "$dest/bin" "$dest/lib"
dest=$(cd "$dest" && pwd)
libdir=$(cd "$libdir" && pwd)
if [ "$libdir" != "$dest/lib" ]; then
  ln -sfn "$libdir/libnvidia-ml.so.1" "$dest/lib/libnvidia-ml.so.1"
fi
# Each simulated host gets GPU UUIDs of its own (the last group derived from DEST), as two real hosts
# would (MIG device UUIDs too): the modules refuse a GPU that another MPS daemon on the host serves, found by the UUIDs in
# that daemon's CUDA_VISIBLE_DEVICES, and simulated hosts share one machine's processes.
if [ ! -f "$dest/nvml.ini" ]; then
  suffix=$(printf '%s' "$dest" | sha256sum | cut -c1-12)
  sed -E "s/^(uuid[[:space:]]*=[[:space:]]*(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-)[0-9a-fA-F]{12}/\\1$suffix/" \
    "$config" > "$dest/nvml.ini.tmp"
  mv -f "$dest/nvml.ini.tmp" "$dest/nvml.ini"
fi

wrapper() {
  local name=$1 script=$2
  cat > "$dest/bin/$name.tmp" <<WRAPPER
#!/bin/sh
# simulated GPU host $dest (tests/fakes/make-simhost.sh)
export FAKE_NVML_CONFIG="\${FAKE_NVML_CONFIG:-$dest/nvml.ini}"
export LD_LIBRARY_PATH="$dest/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
if [ -f "$dest/mps.env" ]; then . "$dest/mps.env"; fi
exec "$python" "$script" "\$@"
WRAPPER
  chmod 0755 "$dest/bin/$name.tmp"
  mv -f "$dest/bin/$name.tmp" "$dest/bin/$name"
}
wrapper nvidia-cuda-mps-control "$fakes/mps/mps_sim.py"
wrapper mps-sim-client "$fakes/mps/mps_client.py"
wrapper nvidia-smi "$fakes/nvidia_smi.py"

cat > "$dest/env" <<ENV
# Simulated GPU host (tests/fakes/make-simhost.sh). Use: . $dest/env
export GPUFLEET_SIMHOST="$dest"
export PATH="$dest/bin:$(dirname "$python"):\$PATH"
export LD_LIBRARY_PATH="$dest/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export FAKE_NVML_CONFIG="$dest/nvml.ini"
ENV
