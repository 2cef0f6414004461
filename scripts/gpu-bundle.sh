#!/usr/bin/env bash
# Run here, before a GPU session: the device machine cannot fetch anything, and its image has
# CUDA, CMake and ninja but none of Debian's -dev packages accrue builds with. This downloads
# them as .deb files into .gpu-deps/ (git-ignored, about 13 MB), and packs MNIST and CMUdict
# (fetched and verified by their scripts) into .gpu-deps/data/datasets.tar.gz (about 12 MB) for
# gpu-check.sh's train mode, so a device run can carry them:
#   run(command="scripts/gpu-check.sh", carry=[".gpu-deps"])
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-deps && mkdir -p .gpu-deps
[ -n "$(find /var/lib/apt/lists -name '*Packages*' -print -quit 2>/dev/null)" ] || apt-get update -qq
(cd .gpu-deps && apt-get download -q libopenblas0-openmp libopenblas-openmp-dev libopenblas-dev \
  libopenblas0 libgfortran5 libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian \
  libcli11-dev nlohmann-json3-dev 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
ls .gpu-deps/*.deb >/dev/null
echo "bundled $(ls .gpu-deps/*.deb | wc -l) packages in .gpu-deps ($(du -sh .gpu-deps | cut -f1))"
scripts/fetch-mnist.sh data/mnist
scripts/fetch-cmudict.sh data/cmudict
mkdir -p .gpu-deps/data
tar -czf .gpu-deps/data/datasets.tar.gz -C data mnist cmudict/dict.txt
echo "packed MNIST and CMUdict in .gpu-deps/data ($(du -sh .gpu-deps/data | cut -f1))"
