#!/usr/bin/env bash
# Compares the CPU GEMM libraries at the MNIST micro-step's shapes (W1, micro-batch 32) and at
# 1024^3, each called once with its own threading ("lib") and under accrue's fixed cut ("cut"),
# on one thread and on every core, in float32 and (oneDNN, on a CPU with AVX512-BF16) bf16, and
# writes bench/results/gemm-libs-<machine>.md. Installs
# BLIS, oneDNN and libxsmm (Debian packages) when missing. Usage: bench/gemm-libs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${ACCRUE_SKIP_DEPS:-}" ] || {
  scripts/install-deps.sh
  missing=()
  for p in libblis-openmp-dev libdnnl-dev libxsmm-dev pkg-config; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
}
build=${ACCRUE_BENCH_BUILD_DIR:-build-bench}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCRUE_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null

slug() { tr '[:upper:]' '[:lower:]' | sed -e 's/[^a-z0-9]\+/-/g' -e 's/^-//' -e 's/-$//'; }
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
name="cpu-$(echo "$cpu" | slug)-$(nproc)core"
libs=()
for l in openblas blis onednn libxsmm; do [ -x "$build/bench/accrue-gemm-$l" ] && libs+=("$l"); done
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
for threads in 1 "$(nproc)"; do
  for l in "${libs[@]}"; do
    OMP_NUM_THREADS=$threads BLIS_NUM_THREADS=$threads "$build/bench/accrue-gemm-$l" \
      --benchmark_format=csv --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_min_time=0.2 2>/dev/null | grep '_median"' | sed "s/^/$threads,/" >> "$csv"
  done
done

# bfloat16 columns where the oneDNN executable timed them (a CPU with AVX512-BF16)
columns=("${libs[@]}")
grep -q '"onednn_bf16/' "$csv" && columns+=(onednn_bf16)
out="bench/results/gemm-libs-$name.md"
{
  echo "# CPU GEMM libraries at accrue's shapes"
  echo
  echo "Produced by \`bench/gemm-libs.sh\` on $(date -u +%Y-%m-%d) ($cpu, $(nproc) cores). float32,"
  echo "GFLOP/s, median of 3. \`lib\`: one call threaded by the library; \`cut\`: accrue's fixed cut"
  echo "(kernels/cpu/gemm_cut.h), one single-threaded call per block, blocks on accrue's threads."
  echo "\`onednn_bf16\`: the same products with bfloat16 A and B and float32 C on oneDNN's matmul"
  echo "(kernels/cpu/onednn.h), where the CPU has AVX512-BF16; its \`cut\` is accrue's bf16 GEMM."
  echo "W1 rows are the 11 GEMMs of a micro-batch-32 step of the 784-512-256-128-10 MLP; the"
  echo "\`W1 step\` row is their summed time in microseconds (lower is better)."
  for threads in 1 "$(nproc)"; do
    echo
    echo "## $threads thread(s)"
    echo
    awk -F, -v threads="$threads" -v libs="${columns[*]}" '
      $1 == threads {
        gsub(/"/, "", $2); split($2, p, "/")  # lib/role/shape/mode_median
        mode = (p[4] ~ /^accrue_cut/) ? "cut" : "lib"
        key = p[2] " " p[3]
        if (!(key in seen)) { seen[key] = 1; order[++n] = key }
        gflops[key, p[1], mode] = $12 / 1e9
        if (p[2] != "large") step[p[1], mode] += $4 / 1000  # ns -> us
      }
      END {
        nl = split(libs, L, " ")
        header = "| GEMM |"; rule = "|---|"
        for (i = 1; i <= nl; ++i) { header = header " " L[i] " lib | " L[i] " cut |"; rule = rule "---|---|" }
        print header; print rule
        for (r = 1; r <= n; ++r) {
          line = "| " order[r] " |"
          for (i = 1; i <= nl; ++i)
            line = line sprintf(" %.1f | %.1f |", gflops[order[r], L[i], "lib"], gflops[order[r], L[i], "cut"])
          print line
        }
        line = "| W1 step (us) |"
        for (i = 1; i <= nl; ++i) line = line sprintf(" %.0f | %.0f |", step[L[i], "lib"], step[L[i], "cut"])
        print line
      }' "$csv"
  done
} > "$out"
cat "$out"
