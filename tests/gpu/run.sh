#!/usr/bin/env bash
# Compare the MPS simulator with the real nvidia-cuda-mps-control on this GPU host, and
# with the recorded real answers (tests/fakes/mps/recorded/), and measure the limits' effects.
# Run from anywhere (it changes to the repository root); needs only python3 and the
# NVIDIA driver; builds nothing. Exits 0 with "SKIP: ..." on a host without them.
# Extra arguments go to compare_mps.py (e.g. --json /tmp/mps-compare.json --keep).
# Then the fleet role end to end on GPU 0 (tests/gpu/role_e2e.py; WHEELS=DIR: ansible-core wheels).
# Bounded: each compare side has --deadline seconds (240); TERMs from the outer bounds below
# (330 s, 90 s and 150 s, under a 10-minute remote command limit) stop them the same way, after which
# each kills every daemon, server and client it started.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
PYTHON="${PYTHON:-python3}"
bound() {  # seconds, command...: a TERM at the bound (the scripts clean up on it), KILL 30 s later
  if command -v timeout >/dev/null 2>&1; then timeout -s TERM -k 30 "$@"; else shift; "$@"; fi
}
bound 330 "$PYTHON" tests/gpu/compare_mps.py "$@"
compared=$?
# The MPS v3 questions (r615+ only: SKIP at once elsewhere), real binary beside the simulator; differences printed.
bound 90 "$PYTHON" tests/gpu/v3_questions.py --deadline 40 --json "${V3_JSON:-/tmp/mps-v3-questions.json}"
asked=$?
# The fleet role end to end on GPU 0 (ansible-core from $WHEELS, a directory of wheels, on an offline host).
bound 150 "$PYTHON" tests/gpu/role_e2e.py ${WHEELS:+--wheels "$WHEELS"}
role=$?
exit $(( compared != 0 || asked != 0 || role != 0 ))
