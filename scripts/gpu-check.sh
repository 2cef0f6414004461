#!/usr/bin/env bash
# Run on the device machine, with .gpu-deps carried from scripts/gpu-bundle.sh. One call fits the
# device tool's 10 minutes on one H100/H200 with 16 cores:
#   run(command="scripts/gpu-check.sh", carry=[".gpu-deps"], timeout_s=600)
# It unpacks the bundled packages into a private prefix, finds cuDNN and NCCL (beside the toolkit,
# else in the image's Python wheels), builds with CUDA for the GPU present, and then, in order of
# worth, each step only while the deadline (GPU_CHECK_SECONDS, default 540) leaves time for it:
#   train     trains on the device (data from .gpu-deps/data, packed by gpu-bundle.sh): the MNIST
#             MLP's default recipe for one epoch eagerly and with CUDA graphs (their weights
#             compared with cmp), in bf16, at 32 x 1 and 32 x 8 (peak bytes against k); G2P for
#             300 steps eagerly, with graphs (cmp) and in bf16; the GroupNorm CNN for one epoch
#             eagerly and with graphs (cmp); then PyTorch eager's MLP and G2P on the same GPU
#             (bench/peers/torch_cuda.py) when the image has PyTorch with CUDA. Writes train.md
#             and train.json (scripts/lib/train-report.py) and every log in train-logs.tar.gz
#   tests     every gtest binary run whole, one process each, six at a time, then through CTest
#             what is not a gtest case (the MPI jobs, the benchmark smoke, the scripts; not
#             install_consumer, a CPU build CI runs). CTest's process per case paid the CUDA
#             context's start, about 2 s in the device's VM, 1,300 times: 250 s on 2026-11-27
#   memcheck  every test binary under compute-sanitizer memcheck, several at once (accesses only,
#             no --leak-check: the caching allocators, each device's fault record and scratch,
#             and the cuBLAS/cuDNN handles hold device memory until the process ends by design;
#             the allocator tests check that live bytes return to their baseline instead)
#   sanitize  racecheck, synccheck and initcheck over the CUDA cases of the kernel tests
#   bench     the CUDA rows of accrue-bench beside the device's own GEMM rate and bandwidth
# and, only when named:
#   g2p       the G2P default recipe whole on the GPU, its test PER and WER (#51's stretch), then
#             bench/g2p-table.sh on the GPU under GPU_CHECK_G2P_BUDGET (default: the script's)
#   zero      (about 60 s) every ZeRO stage, policy and offload on the GPU in a world of one rank,
#             each step's loss against the plain run's (scripts/lib/zero-smoke.sh): the released and
#             reacquired buffers, ZeRO-3's layer-by-layer window, the restricted host copies
# Modes may be named to run only those. To rerun what failed, narrow each step:
#   GPU_CHECK_TARGETS   build only these targets (default: all)
#   GPU_CHECK_TESTS     CTest's -R regular expression for the cases that are not gtest's
#   GPU_CHECK_BINARIES  the test binaries the tests and sanitizers run (default: every one built)
#   GPU_CHECK_FILTER    the gtest filter of the tests and memcheck (default: '*')
#   GPU_CHECK_PEERS=0   train leaves out the PyTorch peers (about 40 s)
#   GPU_CHECK_BENCH     the benchmark filter of bench (default: the GEMM, convolution, MNIST
#                       step and softmax rows on CUDA; /cuda: every CUDA row)
# The script fails (exit 1) when no GPU is usable, since then every CUDA test would skip and prove
# nothing, when any test or sanitizer reports an error, and when a step was left out for time.
# Logs go to $OUT (or gpu-check/), at most 8 files so the device tool brings them all back; the
# build stays in build-gpu/ between calls. With .gpu-deps/prebuilt.tar.xz from gpu-prebuild.sh,
# made from the same sources, there is no build (use_prebuilt below). On an H200: the build took
# 159 s (2026-11-26), 262 s and 396 s since; train 64 s; every test binary 133 s, 15 s without
# the slow IDX case fixed after that run; memcheck 200 s for the same reason, else about 25 s;
# racecheck, synccheck and initcheck 48 s; every benchmark row 100 s (2026-11-26; since, they
# outgrow the step's time: GPU_CHECK_BENCH narrows them).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
modes=("$@")
[ "${#modes[@]}" -eq 0 ] && modes=(train tests memcheck sanitize bench)
deadline=${GPU_CHECK_SECONDS:-540}
end=$(($(date +%s) + deadline))
out=${OUT:-gpu-check}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
status=0
note() { echo "gpu-check [${SECONDS}s]: $*" | tee -a "$summary"; }
fail() {
  note "FAILED: $*"
  status=1
}
# Whether a step needing about $1 seconds still fits before the deadline.
fits() {
  [ $((SECONDS + $1)) -le "$deadline" ] && return 0
  fail "$2 left out: ${SECONDS}s used, it needs about $1 of the ${deadline}s"
  return 1
}

deps=/tmp/accrue-deps
if [ ! -d "$deps/usr" ]; then
  mkdir -p "$deps"
  for f in .gpu-deps/*.deb; do dpkg -x "$f" "$deps"; done
fi
lib="$deps/usr/lib/x86_64-linux-gnu"
export PATH="/usr/local/cuda/bin:$PATH"
export CMAKE_PREFIX_PATH="$deps/usr"
export CMAKE_LIBRARY_PATH="$lib/openblas-openmp"
export LD_LIBRARY_PATH="$lib/openblas-openmp:$lib:${LD_LIBRARY_PATH:-}"
# Parallel test processes share 16 cores: two OpenMP threads each.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# A GPU the CUDA 13 runtime can use, or stop here.
if ! nvidia-smi >> "$summary" 2>&1; then
  fail "nvidia-smi failed: no usable GPU"
  exit 1
fi
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)

# cuDNN and NCCL: beside the toolkit when installed there, else the image's Python wheels (which
# ship only the versioned libraries, so CMake gets the files themselves).
library_flags=()
find_beside() {  # header library-glob cmake-prefix
  local header library
  [ -f "/usr/local/cuda/include/$1" ] && return 0
  header=$(find /opt /usr -name "$1" -path '*nvidia*' 2>/dev/null | head -1)
  [ -n "$header" ] || { note "no $1 in the toolkit or the image's wheels"; return 0; }
  library=$(ls "$(dirname "$header")"/../lib/$2 2>/dev/null | head -1)
  [ -n "$library" ] || { note "$1 at $header but no $2 beside it"; return 0; }
  library_flags+=("-D$3_INCLUDE_DIR=$(dirname "$header")" "-D$3_LIBRARY=$library")
  LD_LIBRARY_PATH="$(dirname "$library"):$LD_LIBRARY_PATH"
  export LD_LIBRARY_PATH
  note "$1 from $header, library $library"
}
find_beside cudnn.h 'libcudnn.so*' ACCRUE_CUDNN
find_beside nccl.h 'libnccl.so*' ACCRUE_NCCL

build() {
  local targets=()
  # test_ops always: require_device runs one of its cases.
  [ -n "${GPU_CHECK_TARGETS:-}" ] && read -ra targets <<< "--target test_ops $GPU_CHECK_TARGETS"
  [ -f build-gpu/build.ninja ] && cmake --build build-gpu -j"$(nproc)" "${targets[@]}" \
    > "$out/build.txt" 2>&1 && return 0
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCRUE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" "${library_flags[@]}" > "$out/build.txt" 2>&1 ||
    { tail -30 "$out/build.txt"; fail "configure failed"; exit 1; }
  grep "accrue:" "$out/build.txt" | tee -a "$summary"
  cmake --build build-gpu -j"$(nproc)" "${targets[@]}" >> "$out/build.txt" 2>&1 ||
    { grep -B2 -A12 "error" "$out/build.txt" | head -60; fail "build failed"; exit 1; }
  note "built"
}

# The CUDA tests must run, not skip: one of them tells whether the runtime found the GPU. It must
# pass outright (a skip, a missing binary or a library that does not load all stop the run).
probe() {
  probe_output=$(build-gpu/tests/test_ops \
    --gtest_filter='Ops/OpTable.EveryDeviceMatchesCpu/add_tiny' 2>&1)
  echo "$probe_output" | grep -q '^\[  PASSED  \] 1 test' &&
    ! echo "$probe_output" | grep -q SKIPPED
}
require_device() {
  probe && return 0
  echo "$probe_output" | tail -5 | tee -a "$summary"
  fail "the CUDA probe did not pass (a skip: no usable device, or a driver too old for CUDA 13)"
  exit 1
}

# The programs from .gpu-deps/prebuilt.tar.xz (scripts/gpu-prebuild.sh), when they were built from
# the sources here, every library they need is found and the probe passes with them; else nothing
# of them is kept and build() runs. Not when GPU_CHECK_TARGETS asks for a build.
use_prebuilt() {
  [ -f .gpu-deps/prebuilt.tar.xz ] && [ -z "${GPU_CHECK_TARGETS:-}" ] &&
    [ ! -f build-gpu/build.ninja ] || return 1
  # Python's lzma where the image has no xz.
  [ -f build-gpu/source-hash ] || tar -xJf .gpu-deps/prebuilt.tar.xz 2> /dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall()' \
      .gpu-deps/prebuilt.tar.xz ||
    { note "prebuilt: the archive does not unpack: building here"; rm -rf build-gpu; return 1; }
  local built here missing
  built=$(cat build-gpu/source-hash)
  here=$(scripts/lib/source-hash.sh)
  if [ "$built" != "$here" ]; then
    note "prebuilt: made from other sources (${built:0:12}, these are ${here:0:12}): building here"
    rm -rf build-gpu
    return 1
  fi
  # The programs link Debian's Open MPI 4 (libmpi.so.40) by soname: the image's own, wherever
  # its wrapper says it lives.
  local mpi_dirs
  mpi_dirs=$(mpicc --showme:libdirs 2> /dev/null | tr ' ' ':')
  local cuda_dirs=/usr/local/cuda/lib64:/usr/local/cuda/lib
  export LD_LIBRARY_PATH="$cuda_dirs:${mpi_dirs:+$mpi_dirs:}$LD_LIBRARY_PATH"
  missing=$(find build-gpu -type f \( -name 'test_*' -o -name 'accrue-*' \) -perm -u+x \
    -exec ldd {} + 2>/dev/null | grep 'not found' | sort -u | tr -s ' \t\n' ' ')
  if [ -n "$missing" ]; then
    note "prebuilt: libraries not found here ($missing): building here"
    rm -rf build-gpu
    return 1
  fi
  if ! probe; then
    echo "$probe_output" | tail -5 >> "$summary"
    note "prebuilt: the CUDA probe failed with it: building here"
    rm -rf build-gpu
    return 1
  fi
  note "prebuilt: made from these sources (${here:0:12}) at $(cat build-gpu/source-root); no build"
}

# The seconds left before the deadline, at most $1.
left() {
  local l=$((end - $(date +%s)))
  echo $((l < $1 ? l : $1))
}

# Runs test binaries whole under one compute-sanitizer tool (or none: plain runs), several at a
# time, none past the deadline (exit 124 then); a binary's log is kept only when the tool or the
# tests complain.
sanitize() {  # tool|none seconds-per-binary log gtest-filter binaries...
  local tool=$1 seconds=$2 log=$3 filter=$4
  shift 4
  local logs runner="compute-sanitizer --tool $tool --error-exitcode 99" at_once=4
  local label=$tool
  [ "$tool" = none ] && runner="" && at_once=6 && label=run
  logs=$(mktemp -d)
  printf '%s\n' "$@" | xargs -P $at_once -I{} sh -c "l=\$(($end - \$(date +%s))); \
    [ \$l -gt $seconds ] && l=$seconds; [ \$l -lt 5 ] && l=1; s=\$(date +%s); \
    timeout \$l $runner build-gpu/tests/{} \
    --gtest_filter='$filter' --gtest_brief=1 > $logs/{}.log 2>&1; echo \$? > $logs/{}.rc; \
    echo \$((\$(date +%s) - s)) > $logs/{}.seconds"
  for t in "$@"; do
    rc=$(cat "$logs/$t.rc" 2>/dev/null || echo missing)
    echo "== $label $t: exit $rc, $(cat "$logs/$t.seconds" 2>/dev/null) s;" $(grep -o \
      '^\[  \(PASSED\|SKIPPED\|FAILED\) *\] [0-9]* tests\?' "$logs/$t.log") >> "$log"
    # A binary whose selected tests make no CUDA call ends "before the first instrumented API
    # call" (exit 255): nothing to check, and not a failure when its tests passed.
    if [ "$rc" = 255 ] && grep -q "terminated before first instrumented API call" "$logs/$t.log" &&
      ! grep -q '^\[  FAILED  \]' "$logs/$t.log"; then
      echo "   no CUDA calls" >> "$log"
    elif [ "$rc" != 0 ]; then
      # Each kernel or API call the tool names, counted, then the end of the log.
      grep -A1 "^========= [A-Z]" "$logs/$t.log" | grep "^=========     at " |
        sed 's/+0x[0-9a-f]*$//' |
        sort | uniq -c | sort -rn | head -20 >> "$log"
      grep '^\[  FAILED  \]' "$logs/$t.log" | sort -u >> "$log"
      tail -40 "$logs/$t.log" >> "$log"
      fail "$label $t: exit $rc"
    else
      grep "ERROR SUMMARY" "$logs/$t.log" >> "$log"
    fi
  done
  rm -rf "$logs"
}

# One training run: NAME SECONDS PROGRAM ARGS...; its log, metrics and wall time go to $work.
train_run() {
  local name=$1 seconds=$2 start rc
  shift 2
  [ "$(left "$seconds")" -ge 10 ] || { fail "train $name left out: no time"; return 1; }
  start=$(date +%s.%N)
  timeout "$(left "$seconds")" "$@" --metrics "$work/$name.jsonl" > "$work/$name.log" 2>&1
  rc=$?
  awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f\n", b - a }' > "$work/$name.seconds"
  if [ "$rc" -ne 0 ]; then
    tail -5 "$work/$name.log" | tee -a "$summary"
    fail "train $name: exit $rc (124: out of time)"
    return 1
  fi
  note "train $name: $(grep '^done:' "$work/$name.log" | cut -c1-160)"
}

# Two runs' saved weights, byte for byte: a line of checks.txt either way.
same_weights() {  # what a.safetensors b.safetensors
  if cmp -s "$2" "$3"; then
    echo "$1: the weights are identical (cmp)" >> "$work/checks.txt"
  else
    echo "$1: the weights DIFFER (cmp $(basename "$2") $(basename "$3"))" >> "$work/checks.txt"
    fail "$1: the weights differ"
  fi
}

train_on_device() {
  work=$(mktemp -d)
  : > "$work/checks.txt"
  mkdir -p data
  [ -f data/mnist/train-images-idx3-ubyte ] && [ -f data/cmudict/dict.txt ] ||
    tar -xzf .gpu-deps/data/datasets.tar.gz -C data ||
    { fail "no datasets: run scripts/gpu-bundle.sh here first"; return; }
  scripts/fetch-mnist.sh data/mnist >> "$summary" 2>&1 && scripts/fetch-cmudict.sh data/cmudict \
    >> "$summary" 2>&1 || { fail "the datasets do not verify"; return; }
  local mnist=(build-gpu/examples/accrue-mnist --data data/mnist --device cuda)
  local g2p=(build-gpu/examples/accrue-g2p --data data/cmudict/dict.txt --device cuda
    --eval-limit 1000)
  train_run mlp-eager 60 "${mnist[@]}" --epochs 1 --cuda-graphs off --save "$work/mlp-eager.st"
  train_run mlp-graphs 60 "${mnist[@]}" --epochs 1 --cuda-graphs on --save "$work/mlp-graphs.st" &&
    same_weights "MNIST MLP, one epoch, --cuda-graphs on against off" "$work/mlp-eager.st" \
      "$work/mlp-graphs.st"
  train_run mlp-bf16 60 "${mnist[@]}" --epochs 1 --precision bf16
  # The profiler times each replay as one call; its table lands in the log.
  train_run mlp-profile 40 "${mnist[@]}" --max-steps 200 --profile &&
    grep -E "^(graph: |boundary |adam_step|linear_forward)" "$work/mlp-profile.log" | head -8 |
    sed 's/^/profile, MNIST MLP with graphs, 200 steps: /' >> "$work/checks.txt"
  # Eager, each primitive is timed on the device (events) and on the host (until it returned):
  # which kernels a micro-step spends on, and what the host spends launching them.
  train_run mlp-profile-eager 40 "${mnist[@]}" --max-steps 200 --cuda-graphs off --profile &&
    { grep -A12 '^\[profile\] [0-9.]* s in backend' "$work/mlp-profile-eager.log" | head -13
      grep -A10 '^\[profile\] [0-9.]* s of host time' "$work/mlp-profile-eager.log" | head -11
    } | sed 's/^/profile, MNIST MLP eager, 200 steps: /' >> "$work/checks.txt"
  # Where the GroupNorm CNN's and G2P's steps go, kernel by kernel (eager: each primitive timed).
  train_run cnn-profile-eager 40 "${mnist[@]}" --model cnn --norm group --max-steps 100 \
    --cuda-graphs off --profile &&
    grep -A14 '^\[profile\] [0-9.]* s in backend' "$work/cnn-profile-eager.log" | head -15 |
    sed 's/^/profile, GroupNorm CNN eager, 100 steps: /' >> "$work/checks.txt"
  train_run g2p-profile-eager 40 "${g2p[@]}" --max-steps 60 --cuda-graphs off --profile &&
    grep -A14 '^\[profile\] [0-9.]* s in backend' "$work/g2p-profile-eager.log" | head -15 |
    sed 's/^/profile, G2P eager, 60 steps: /' >> "$work/checks.txt"
  train_run mlp-32x1 40 "${mnist[@]}" --micro-batch 32 --accum-steps 1 --max-steps 200
  train_run mlp-32x8 40 "${mnist[@]}" --micro-batch 32 --accum-steps 8 --max-steps 200
  train_run g2p-eager 90 "${g2p[@]}" --max-steps 300 --cuda-graphs off --save "$work/g2p-eager.st"
  train_run g2p-graphs 90 "${g2p[@]}" --max-steps 300 --cuda-graphs on \
    --save "$work/g2p-graphs.st" &&
    same_weights "G2P, 300 steps, --cuda-graphs on against off" "$work/g2p-eager.st" \
      "$work/g2p-graphs.st"
  train_run g2p-bf16 90 "${g2p[@]}" --max-steps 300 --precision bf16
  train_run cnn-eager 90 "${mnist[@]}" --model cnn --norm group --epochs 1 --cuda-graphs off \
    --save "$work/cnn-eager.st"
  train_run cnn-graphs 90 "${mnist[@]}" --model cnn --norm group --epochs 1 --cuda-graphs on \
    --save "$work/cnn-graphs.st" &&
    same_weights "GroupNorm CNN, one epoch, --cuda-graphs on against off" "$work/cnn-eager.st" \
      "$work/cnn-graphs.st"
  if [ "${GPU_CHECK_PEERS:-1}" = 0 ]; then
    echo "PyTorch peers: left out (GPU_CHECK_PEERS=0)" >> "$work/checks.txt"
  elif python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    > /dev/null 2>&1; then
    for peer in mnist g2p; do
      [ "$(left 60)" -ge 20 ] || { fail "PyTorch $peer left out: no time"; continue; }
      timeout "$(left 60)" python3 bench/peers/torch_cuda.py "$peer" > "$work/torch-$peer.txt" \
        2>&1 || { tail -5 "$work/torch-$peer.txt" >> "$summary"; fail "PyTorch $peer failed"; }
      note "PyTorch $peer: $(grep train_seconds "$work/torch-$peer.txt")"
    done
  else
    echo "PyTorch with CUDA: not in this image (python3 -c 'import torch' failed or no GPU)" \
      >> "$work/checks.txt"
  fi
  python3 scripts/lib/train-report.py "$work" "$(nvidia-smi --query-gpu=name --format=csv,noheader \
    | head -1)" "${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" ||
    fail "train-report.py failed"
  cp "$work/train.md" "$work/train.json" "$out/" 2>/dev/null
  tar -czf "$out/train-logs.tar.gz" -C "$work" --exclude='*.st' .
  cat "$work/checks.txt" >> "$summary"
}

use_prebuilt || build
require_device
# The MPI tests need mpirun and run through CTest alone.
binaries=${GPU_CHECK_BINARIES:-$(cd build-gpu/tests && for t in test_*; do
  [ -x "$t" ] && [ "${t#test_dist}" = "$t" ] && echo "$t"
done)}
for mode in "${modes[@]}"; do
  case "$mode" in
    tests)
      fits 60 "the test binaries" || continue
      : > "$out/tests.txt"
      # shellcheck disable=SC2086
      sanitize none 200 "$out/tests.txt" "${GPU_CHECK_FILTER:-*}" $binaries
      grep -c ': exit 0,' "$out/tests.txt" | sed 's/^/test binaries passed: /' | tee -a "$summary"
      fits 40 "CTest's cases outside gtest" || continue
      # A prebuilt tree's CTest files name the folder it was built in.
      if [ -f build-gpu/source-root ] && [ "$(cat build-gpu/source-root)" != "$(pwd)" ]; then
        fail "CTest's cases outside gtest left out: prebuilt in $(cat build-gpu/source-root)"
        continue
      fi
      # Not the CPU-only checks of the build and the scripts, which CI runs: a prebuilt tree's
      # CTest names this machine's cmake (layers.*, blas_core.*), and the image has no gnuplot.
      others=$(ctest --test-dir build-gpu --show-only=json-v1 | python3 -c '
import json, re, sys
tests = json.load(sys.stdin)["tests"]
cpu_only = ("install_consumer", "layers.", "blas_core.", "PlotMetrics.")
names = [t["name"] for t in tests if not t["name"].startswith(cpu_only) and
         not any(a.startswith("--gtest_filter") for a in t.get("command", []))]
print("|".join(re.escape(n) for n in names))')
      timeout "$(left 180)" ctest --test-dir build-gpu --output-on-failure -j6 --timeout 150 \
        -R "${GPU_CHECK_TESTS:-^(${others:-none})\$}" \
        > "$out/ctest.txt" 2>&1 || fail "ctest failed (exit $?; 124: ran out of time)"
      grep "tests passed\|Total Test time" "$out/ctest.txt" | tee -a "$summary"
      grep -i "Skipped\|\*\*\*Failed\|Timeout" "$out/ctest.txt" | head -40 >> "$summary"
      ;;
    memcheck)
      fits 120 "memcheck" || continue
      : > "$out/memcheck.txt"
      # shellcheck disable=SC2086
      sanitize memcheck 200 "$out/memcheck.txt" "${GPU_CHECK_FILTER:-*}" $binaries
      note "memcheck done"
      ;;
    sanitize)
      fits 90 "racecheck, synccheck and initcheck" || continue
      # The CUDA cases only: the CPU ones launch nothing. Kernels of every family run here.
      filter='*cuda*:*Device*:*Cuda*:Ops/OpTable.EveryDeviceMatchesCpu/*:Backend*'
      : > "$out/sanitize.txt"
      for tool in racecheck synccheck initcheck; do
        fits 30 "$tool" || continue
        # shellcheck disable=SC2086
        sanitize "$tool" 150 "$out/sanitize.txt" "$filter" ${GPU_CHECK_BINARIES:-test_ops \
          test_backend test_accumulation test_allocator test_offload}
        note "$tool done"
      done
      ;;
    train)
      fits 120 "training on the device" || continue
      train_on_device
      ;;
    g2p)
      # Issue #51's stretch: the whole default recipe (test PER and WER), then the language-model
      # table under a device budget (bench/g2p-table.sh), offloading saving the GPU's bytes.
      fits 150 "the G2P default recipe" || continue
      [ -f data/cmudict/dict.txt ] || { mkdir -p data && tar -xzf .gpu-deps/data/datasets.tar.gz \
        -C data; } || { fail "no datasets: run scripts/gpu-bundle.sh here first"; continue; }
      timeout "$(left 300)" build-gpu/examples/accrue-g2p --data data/cmudict/dict.txt \
        --device cuda --metrics "$out/g2p-recipe.jsonl" > "$out/g2p-recipe.txt" 2>&1 ||
        fail "the G2P default recipe: exit $? (124: out of time)"
      note "G2P default recipe: $(grep '^done:' "$out/g2p-recipe.txt" | cut -c1-200)"
      fits 60 "the G2P table on the GPU" || continue
      # An empty budget or sample count is g2p-table.sh's own default.
      ACCRUE_SKIP_DEPS=1 timeout "$(left 150)" bench/g2p-table.sh build-gpu \
        "${GPU_CHECK_G2P_BUDGET:-}" "" cuda > "$out/g2p-table.txt" 2>&1 ||
        fail "bench/g2p-table.sh on the GPU: exit $?"
      cp bench/results/g2p-table-cuda.md bench/results/g2p-table-cuda.csv "$out/" 2>/dev/null
      note "G2P table on the GPU: $(wc -l < "$out/g2p-table-cuda.csv" 2>/dev/null) lines"
      ;;
    zero)
      fits 60 "the ZeRO smoke" || continue
      [ -f data/mnist/train-images-idx3-ubyte ] && [ -f data/cmudict/dict.txt ] ||
        { mkdir -p data && tar -xzf .gpu-deps/data/datasets.tar.gz -C data; } ||
        { fail "no datasets: run scripts/gpu-bundle.sh here first"; continue; }
      timeout "$(left 120)" scripts/lib/zero-smoke.sh cuda build-gpu data/mnist \
        data/cmudict/dict.txt "$out/zero" > "$out/zero.txt" 2>&1 || fail "the ZeRO smoke failed"
      grep -c " ok$" "$out/zero.txt" | sed 's/^/zero smoke: runs within 1e-4: /' | tee -a "$summary"
      grep -v " ok$" "$out/zero.txt" | head -20 >> "$summary"
      rm -rf "$out/zero"  # the device tool brings back at most 8 files
      ;;
    bench)
      fits 110 "the CUDA benchmarks" || continue
      # Every CUDA row takes longer than the step's 150 s: the training path's rows by default.
      default_bench='^(gemm_[a-z_0-9]+|conv2d_[a-z_0-9]+|mnist_micro_step|mnist_boundary_step|softmax_ce)/cuda'
      timeout "$(left 150)" build-gpu/bench/accrue-bench \
        --benchmark_filter="${GPU_CHECK_BENCH:-$default_bench}" \
        --benchmark_min_time=0.1 --benchmark_out="$out/bench-cuda.json" \
        --benchmark_out_format=json > /tmp/bench-cuda.txt 2>&1 ||
        { tail -20 /tmp/bench-cuda.txt >> "$summary"; fail "accrue-bench failed"; continue; }
      build-gpu/bench/accrue-bench-report "$out/bench-cuda.json" > "$out/bench-cuda.md" 2>&1 ||
        fail "accrue-bench-report failed"
      note "bench done"
      ;;
    *)
      echo "gpu-check: unknown mode '$mode' (train, tests, memcheck, sanitize, bench, g2p, zero)"
      exit 2
      ;;
  esac
done
[ "$status" -eq 0 ] && note "all passed" || note "FAILED (see summary.txt)"
# The device tool brings back at most 8 files: past that, every file but the summary and the
# result tables travels in one archive.
if [ "$(find "$out" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$out" && find . -maxdepth 1 -type f ! -name summary.txt ! -name 'train.*' \
    ! -name 'bench-cuda.*' ! -name '*.tar.gz' -printf '%P\n' > /tmp/gpu-check-logs &&
    tar -czf logs.tar.gz -T /tmp/gpu-check-logs && xargs rm -f < /tmp/gpu-check-logs)
fi
exit "$status"
