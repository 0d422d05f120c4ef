#!/usr/bin/env bash
# Compare the MPS simulator with the real nvidia-cuda-mps-control on this GPU host.
# Run from anywhere (it changes to the repository root); needs only python3 and the
# NVIDIA driver; builds nothing. Exits 0 with "SKIP: ..." on a host without them.
# Extra arguments go to compare_mps.py (e.g. --json /tmp/mps-compare.json --keep).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
exec "$PYTHON" tests/gpu/compare_mps.py "$@"
