#!/usr/bin/env bash
# Builds accrue and runs the whole test suite: installs missing packages, configures (CUDA
# targets too whenever nvcc is found), builds, runs CTest; then builds the CPU library, tests and
# examples again under AddressSanitizer and UndefinedBehaviorSanitizer and runs CTest there too.
# This is what CI runs through .ci/run.
# Usage: scripts/test.sh [--no-sanitize]   (--no-sanitize: the first pass only, for quick loops)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --with-plot  # gnuplot and jq: the test of scripts/plot-metrics.sh
jobs=$(nproc)
build=${ACCRUE_BUILD_DIR:-build}
# Without a GPU the CUDA targets are compiled for one architecture only: the check is that they
# build, and each further architecture costs a 2-core machine minutes. With a GPU the cache (or
# cmake/cuda.cmake's default list) decides.
cuda_flags=()
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  nvidia-smi -L >/dev/null 2>&1 || cuda_flags=(-DCMAKE_CUDA_ARCHITECTURES=90)
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_flags[@]}"
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs"

[ "${1:-}" = "--no-sanitize" ] && exit 0
echo "accrue: the suite again under AddressSanitizer + UndefinedBehaviorSanitizer" >&2
sanitize=${ACCRUE_SANITIZE_BUILD_DIR:-build-sanitize}
cmake -S . -B "$sanitize" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACCRUE_SANITIZE=ON \
  -DACCRUE_CUDA=OFF -DACCRUE_BUILD_BENCH=OFF
cmake --build "$sanitize" -j"$jobs"
# Leaks are errors too; OpenMP's worker threads are reused, so the suite stays quick.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$sanitize" --output-on-failure -j"$jobs"
