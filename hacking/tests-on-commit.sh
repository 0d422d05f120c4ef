#!/usr/bin/env bash
# Run unit test files of this working tree against the collection as it was at another commit:
#   hacking/tests-on-commit.sh REV TEST_FILE...
# Used to show that a regression test fails on the code before a fix (issue 26's eleven cases:
#   hacking/tests-on-commit.sh d53cece tests/unit/plugins/modules/test_mps_host_cases.py).
# The test files must import nothing of the collection that REV lacks; REV's own conftest and simulator are used.
set -euo pipefail

rev=${1:?usage: tests-on-commit.sh REV TEST_FILE...}
shift
[ $# -gt 0 ] || { echo "tests-on-commit.sh: name at least one test file" >&2; exit 2; }
src=$(git rev-parse --show-toplevel)
work=$(mktemp -d /tmp/gpufleet-on-commit.XXXXXX)
trap 'git -C "$src" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

git -C "$src" worktree add --detach "$work/tree" "$rev" >/dev/null
for file in "$@"; do
  mkdir -p "$work/tree/$(dirname "$file")"
  cp "$src/$file" "$work/tree/$file"
done
(cd "$work/tree" && "$src/hacking/collection-tree.sh" "$work/collections" >/dev/null)
cd "$work/collections/ansible_collections/gpufleet/mps"
# shellcheck disable=SC1091
. "$src/.simhost/env"
status=0
PYTHONPATH="$work/collections" "$src/.venv/bin/python" -m pytest -p no:cacheprovider -q -rf "$@" || status=$?
exit $status
