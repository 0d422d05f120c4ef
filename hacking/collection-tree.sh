#!/usr/bin/env bash
# Copy the collection's files (tracked, plus new files git does not ignore) to
# DEST/ansible_collections/gpufleet/mps, a real path as ansible-test requires. DEST must be outside
# this git checkout: ansible-test walks up to the nearest .git and would list files from there.
set -euo pipefail

dest_root=${1:?usage: collection-tree.sh DEST}
src=$(git rev-parse --show-toplevel)
dest="$dest_root/ansible_collections/gpufleet/mps"

case "$dest/" in
  "$src"/*) echo "collection-tree.sh: $dest is inside the checkout $src" >&2; exit 2 ;;
esac

# Keep ansible-test's own output between runs; replace everything else.
if [ -d "$dest" ]; then
  find "$dest" -mindepth 1 -maxdepth 1 ! -name tests -exec rm -rf {} +
  if [ -d "$dest/tests" ]; then
    find "$dest/tests" -mindepth 1 -maxdepth 1 ! -name output -exec rm -rf {} +
  fi
fi
mkdir -p "$dest"

cd "$src"
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' path; do [ -e "$path" ] && printf '%s\0' "$path"; done \
  | tar --null --no-recursion -T - -cf - \
  | tar -xf - -C "$dest"
echo "$dest"
