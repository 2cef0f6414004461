#!/usr/bin/env bash
# One hash of every file a build compiles from: the same command on this machine and on the device
# machine (which receives the working tree without .git), so gpu-check.sh can tell whether a
# prebuilt archive (scripts/gpu-prebuild.sh) was built from the sources it is about to test.
# Markdown is left out: tests/GPU-RECORD.md changes after a run, and no build reads it.
set -euo pipefail
cd "$(dirname "$0")/../.."
find CMakeLists.txt accrue.h bench cmake core distributed examples kernels nn ops optim tests train \
  -type f ! -path 'bench/build/*' ! -path 'bench/results/*' ! -name '*.md' -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
