#!/usr/bin/env bash
# Compare the MPS simulator with the real nvidia-cuda-mps-control on this GPU host, and
# with the recorded real answers (tests/fakes/mps/recorded/), and measure the limits' effects.
# Run from anywhere (it changes to the repository root); needs only python3 and the
# NVIDIA driver; builds nothing. Exits 0 with "SKIP: ..." on a host without them.
# Extra arguments go to compare_mps.py (e.g. --json /tmp/mps-compare.json --keep).
# Bounded: each side has --deadline seconds (240); a TERM from the outer bound below
# (570 s, under a 10-minute remote command limit) stops it the same way, after which it
# kills every daemon, server and client it started.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
if command -v timeout >/dev/null 2>&1; then
  exec timeout -s TERM -k 30 570 "$PYTHON" tests/gpu/compare_mps.py "$@"
fi
exec "$PYTHON" tests/gpu/compare_mps.py "$@"
