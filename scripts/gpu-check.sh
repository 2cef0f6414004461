#!/usr/bin/env bash
# Run on the device machine, with .gpu-deps carried from scripts/gpu-bundle.sh:
#   scripts/gpu-check.sh tests   unpack the bundled packages into a private prefix, build with
#                                CUDA for the GPU present, run the suite, then every test binary
#                                under compute-sanitizer memcheck
#   scripts/gpu-check.sh bench   bench/run on the same build (CPU and GPU results)
#   scripts/gpu-check.sh         both (may not fit one 10-minute call)
# Logs and results go to $OUT (or gpu-check/); the build stays in build-gpu/ between calls.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
out=${OUT:-gpu-check}
mkdir -p "$out"
deps=/tmp/accrue-deps
if [ ! -d "$deps/usr" ]; then
  mkdir -p "$deps"
  for f in .gpu-deps/*.deb; do dpkg -x "$f" "$deps"; done
fi
lib="$deps/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$lib/openblas-openmp:$lib:${LD_LIBRARY_PATH:-}"
export CMAKE_PREFIX_PATH="$deps/usr"
export CMAKE_LIBRARY_PATH="$lib/openblas-openmp"
export PATH="/usr/local/cuda/bin:$PATH"

if [ "$mode" = tests ] || [ "$mode" = all ]; then
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCRUE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" > "$out/configure.txt" 2>&1 ||
    { tail -30 "$out/configure.txt"; exit 1; }
  cmake --build build-gpu -j"$(nproc)" > "$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
  ctest --test-dir build-gpu --output-on-failure -j4 > "$out/ctest.txt" 2>&1
  echo "ctest exit $?"
  tail -4 "$out/ctest.txt"
  : > "$out/memcheck.txt"
  for t in build-gpu/tests/test_*; do
    [ -x "$t" ] || continue
    compute-sanitizer --tool memcheck --error-exitcode 99 "$t" --gtest_brief=1 >> "$out/memcheck.txt" 2>&1
    echo "memcheck $(basename "$t"): exit $?" | tee -a "$out/memcheck-summary.txt"
  done
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  ACCRUE_BENCH_BUILD_DIR=build-gpu ACCRUE_SKIP_DEPS=1 bench/run > "$out/bench.txt" 2>&1
  echo "bench/run exit $?"
  tail -3 "$out/bench.txt"
  cp bench/results/*.md bench/results/*.json "$out/" 2>/dev/null || true
fi
