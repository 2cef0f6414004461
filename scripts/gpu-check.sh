#!/usr/bin/env bash
# Run on the device machine, with .gpu-deps carried from scripts/gpu-bundle.sh. Two calls, each
# well inside the device tool's 10 minutes on one H100/H200 with 16 cores:
#   run(command="scripts/gpu-check.sh tests", carry=[".gpu-deps"])
#       unpack the bundled packages into a private prefix, build with CUDA for the GPU present,
#       run the whole suite, then every test binary under compute-sanitizer memcheck (accesses
#       only, no --leak-check: the caching allocators, each device's fault record and scratch,
#       and the cuBLAS/cuDNN handles hold their device memory until the process ends by design,
#       so a leak report would name every binary; the allocator tests check that live bytes
#       return to their baseline instead)
#   run(command="scripts/gpu-check.sh sanitize bench", carry=[".gpu-deps"])
#       racecheck, synccheck and initcheck over the CUDA tests, then bench/run (CPU and GPU)
# Any mode may be given alone; with no argument all three run (may not fit one call). The script
# fails (exit 1) when no GPU is usable, since then every CUDA test would skip and prove nothing,
# and when any test or any compute-sanitizer tool reports an error. Logs and results go to $OUT
# (or gpu-check/); the build stays in build-gpu/ between calls on a warm machine.
set -uo pipefail
cd "$(dirname "$0")/.."
modes=("$@")
[ "${#modes[@]}" -eq 0 ] && modes=(tests sanitize bench)
out=${OUT:-gpu-check}
mkdir -p "$out"
status=0
fail() {
  echo "gpu-check: $*" | tee -a "$out/failures.txt"
  status=1
}

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

# A GPU the CUDA 13 runtime can use, or stop here.
if ! nvidia-smi > "$out/nvidia-smi.txt" 2>&1; then
  cat "$out/nvidia-smi.txt"
  echo "gpu-check: nvidia-smi failed: no usable GPU" | tee "$out/failures.txt"
  exit 1
fi
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)

build() {
  [ -x build-gpu/tests/test_ops ] && cmake --build build-gpu -j"$(nproc)" > "$out/build.txt" 2>&1 &&
    return 0
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCRUE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" > "$out/configure.txt" 2>&1 ||
    { tail -30 "$out/configure.txt"; echo "gpu-check: configure failed"; exit 1; }
  cmake --build build-gpu -j"$(nproc)" > "$out/build.txt" 2>&1 ||
    { tail -40 "$out/build.txt"; echo "gpu-check: build failed"; exit 1; }
}

# The CUDA tests must run, not skip: one of them tells whether the runtime found the GPU.
require_device() {
  local probe
  probe=$(build-gpu/tests/test_ops --gtest_filter='Ops/OpTable.EveryDeviceMatchesCpu/add' 2>&1)
  if echo "$probe" | grep -q "SKIPPED"; then
    echo "$probe" | grep -i "no device\|cuda" | head -3
    echo "gpu-check: the CUDA tests skip on this machine (driver too old for the CUDA 13 runtime?)" |
      tee -a "$out/failures.txt"
    exit 1
  fi
}

for mode in "${modes[@]}"; do
  case "$mode" in
    tests)
      build
      require_device
      ctest --test-dir build-gpu --output-on-failure -j4 > "$out/ctest.txt" 2>&1 || fail "ctest failed"
      tail -4 "$out/ctest.txt"
      grep -q "Skipped" "$out/ctest.txt" && grep "Skipped" "$out/ctest.txt" > "$out/skipped.txt"
      : > "$out/memcheck.txt"
      for t in build-gpu/tests/test_*; do
        [ -x "$t" ] || continue
        timeout 120 compute-sanitizer --tool memcheck --error-exitcode 99 "$t" \
          --gtest_brief=1 >> "$out/memcheck.txt" 2>&1 || fail "memcheck $(basename "$t"): exit $?"
      done
      ;;
    sanitize)
      build
      require_device
      # The CUDA cases only: the CPU ones launch nothing. Kernels of every family run here.
      filter='*cuda*:*Device*:*Cuda*:Ops/OpTable.EveryDeviceMatchesCpu/*:Backend*'
      for tool in racecheck synccheck initcheck; do
        : > "$out/$tool.txt"
        for t in test_ops test_backend test_optim test_accumulation test_allocator test_offload; do
          [ -x "build-gpu/tests/$t" ] || continue
          timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 99 "build-gpu/tests/$t" \
            --gtest_filter="$filter" --gtest_brief=1 >> "$out/$tool.txt" 2>&1 ||
            fail "$tool $t: exit $?"
        done
        echo "$tool done"
      done
      ;;
    bench)
      build
      ACCRUE_BENCH_BUILD_DIR=build-gpu ACCRUE_SKIP_DEPS=1 bench/run > "$out/bench.txt" 2>&1 ||
        fail "bench/run failed"
      tail -3 "$out/bench.txt"
      cp bench/results/*.md bench/results/*.json "$out/" 2>/dev/null || true
      ;;
    *)
      echo "gpu-check: unknown mode '$mode' (tests, sanitize, bench)"
      exit 2
      ;;
  esac
done
[ "$status" -eq 0 ] && echo "gpu-check: all passed" || echo "gpu-check: FAILED (see $out/failures.txt)"
exit "$status"
