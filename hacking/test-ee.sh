#!/usr/bin/env bash
# The execution environment definition is valid and carries the collection's dependencies.
#
# 1. Build the collection tarball from COLLECTION_DIR and run `ansible-builder create` (no container
#    engine) on meta/ee-example/execution-environment.yml, which includes that tarball.
# 2. Check the build context: the Containerfile installs the tarball in its galaxy stage and
#    introspects the installed collections in its builder stage; the tarball carries the collection's
#    dependency file meta/execution-environment.yml with the files it names.
# 3. Do what the builder stage does, here: install the context's tarball as its galaxy stage would,
#    and run the context's own introspect.py on it. The requirements it writes for the image must
#    name nvidia-ml-py (requirements.txt) and every package of bindep.txt, from gpufleet.mps.
# And the user guide (guide_awx.rst) shows the example definition as it is.
#
# `ansible-builder build` needs podman or docker and is not run here.
# usage: test-ee.sh COLLECTION_DIR WORK   (WORK is replaced)
set -euo pipefail

coll=${1:?usage: test-ee.sh COLLECTION_DIR WORK}
work=${2:?WORK missing}
repo=$(cd "$(dirname "$0")/.." && pwd)
fail() {
  echo "test-ee: $*" >&2
  exit 1
}
for tool in ansible-builder ansible-galaxy; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH (make venv installs requirements-dev.txt)"
done
python=$(dirname "$(command -v ansible-builder)")/python
started=$SECONDS

# The user guide shows the definition: it must be the one tested here.
"$python" - "$repo/meta/ee-example/execution-environment.yml" "$repo/docs/docsite/rst/guide_awx.rst" <<'PY' \
  || fail "docs/docsite/rst/guide_awx.rst does not show meta/ee-example/execution-environment.yml as it is"
import re
import sys

import yaml

with open(sys.argv[1], encoding='utf-8') as handle:
    definition = yaml.safe_load(handle)
with open(sys.argv[2], encoding='utf-8') as handle:
    page = handle.read()
block = re.search(r'\n\.\. code-block:: yaml\n\n((?:   version: 3\n)(?:(?:   .*)?\n)*)', page)
sys.exit(0 if block and yaml.safe_load(re.sub(r'(?m)^   ', '', block.group(1))) == definition else 1)
PY

rm -rf "$work"
mkdir -p "$work/ee/collections"
ansible-galaxy collection build --output-path "$work/dist" "$coll" >/dev/null
# The example's layout: the definition next to collections/gpufleet-mps.tar.gz (its comment says how).
cp "$repo/meta/ee-example/execution-environment.yml" "$work/ee/"
cp "$work"/dist/gpufleet-mps-*.tar.gz "$work/ee/collections/gpufleet-mps.tar.gz"

ansible-builder create --file "$work/ee/execution-environment.yml" --context "$work/context" \
  --output-filename Containerfile >"$work/create.log" 2>&1 \
  || { cat "$work/create.log" >&2; fail "ansible-builder create failed"; }
ctx=$work/context
containerfile=$ctx/Containerfile
for needed in "$containerfile" "$ctx/_build/requirements.yml" "$ctx/_build/collections/gpufleet-mps.tar.gz" \
  "$ctx/_build/scripts/introspect.py" "$ctx/_build/scripts/assemble"; do
  [ -f "$needed" ] || fail "the build context lacks ${needed#"$work"/}"
done
grep -q '^FROM base AS galaxy$' "$containerfile" || fail "the Containerfile has no galaxy stage"
grep -q 'ansible-galaxy collection install .*-r requirements.yml' "$containerfile" \
  || fail "the Containerfile does not install the galaxy requirements"
grep -q 'introspect.py introspect' "$containerfile" \
  || fail "the Containerfile does not introspect the collections' dependencies"
grep -q '/build/collections/gpufleet-mps.tar.gz' "$ctx/_build/requirements.yml" \
  || fail "the context's requirements.yml does not name the collection tarball"

listing=$(tar -tzf "$ctx/_build/collections/gpufleet-mps.tar.gz")
for needed in meta/execution-environment.yml requirements.txt bindep.txt; do
  grep -qx "$needed" <<<"$listing" || fail "$needed is missing from the collection tarball in the context"
done

# The galaxy stage (COPY _build /build; ansible-galaxy collection install -r requirements.yml), with
# /build being the context's _build here, and no other collection installed (as in the base image).
sed "s#/build/#$ctx/_build/#" "$ctx/_build/requirements.yml" >"$work/requirements.yml"
ANSIBLE_COLLECTIONS_PATH="$work/usr-share-ansible/collections" \
  ansible-galaxy collection install -r "$work/requirements.yml" -p "$work/usr-share-ansible/collections" \
  >"$work/galaxy.log" 2>&1 || { cat "$work/galaxy.log" >&2; fail "the context's collection does not install"; }

# The builder stage's introspection, with the script the image build will run.
user_bindep=()
[ -f "$ctx/_build/bindep.txt" ] && user_bindep=(--user-bindep "$ctx/_build/bindep.txt")
"$python" "$ctx/_build/scripts/introspect.py" introspect "${user_bindep[@]}" \
  --write-pip "$work/image-requirements.txt" --write-bindep "$work/image-bindep.txt" \
  "$work/usr-share-ansible/collections" >"$work/introspect.log" \
  || fail "introspecting the installed collection failed, as the image build would"
touch "$work/image-requirements.txt" "$work/image-bindep.txt"

# Every requirement the collection declares reaches the image, attributed to gpufleet.mps.
declared() { grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$1" | sed 's/[[:space:]]*#.*//' || true; }
grep -q '^nvidia-ml-py' "$repo/requirements.txt" || fail "requirements.txt does not name nvidia-ml-py"
check() {
  local kind=$1 source=$2 written=$3 line
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    grep -qxF "$line  # from collection gpufleet.mps" "$written" \
      || fail "the image's $kind requirements lack '$line' of $source: $(cat "$written")"
    echo "test-ee: $kind: $line (from gpufleet.mps)"
  done < <(declared "$repo/$source")
}
check python requirements.txt "$work/image-requirements.txt"
check system bindep.txt "$work/image-bindep.txt"
[ -n "$(declared "$repo/bindep.txt")" ] || echo "test-ee: system: bindep.txt declares no package (none needed on the controller)"

echo "test-ee: build context valid in $((SECONDS - started))s: $ctx (ansible-builder build needs podman or docker: not run)"
