#!/usr/bin/env bash
# Builds accrue and runs the whole test suite: installs missing packages, configures (CUDA
# targets too whenever nvcc is found), builds, runs CTest. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build=${ACCRUE_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
