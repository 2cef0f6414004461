#!/usr/bin/env bash
# Compares two builds of accrue-bench on the benchmarks a filter selects, alternating: ROUNDS
# rounds (default 6), each running A then B, each run the median of 3 repetitions. A busy
# neighbour or a slow spell of a shared machine then slows both alike, where two separate
# sittings would compare one spell with another. Prints, per benchmark, each build's run medians
# sorted, their median, and B / A.
# Usage: bench/ab.sh A-binary B-binary filter   (THREADS=1 runs both on one thread)
# e.g. cp build-bench/bench/accrue-bench /tmp/old, rebuild, then
#      bench/ab.sh /tmp/old build-bench/bench/accrue-bench '^max_pool2d_backward/cpu'
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: bench/ab.sh A-binary B-binary filter" >&2
  exit 2
fi
a=$1 b=$2 filter=$3
rounds=${ROUNDS:-6}
for binary in "$a" "$b"; do
  [ -x "$binary" ] || { echo "bench/ab.sh: $binary is not an executable" >&2; exit 2; }
done
positive() {  # $1: name, $2: value
  case $2 in
    '' | *[!0-9]* | 0*) echo "bench/ab.sh: $1 must be a positive integer" >&2; exit 2 ;;
  esac
}
positive ROUNDS "$rounds"
threads=()
if [ -n "${THREADS+set}" ]; then
  positive THREADS "$THREADS"
  threads=(env "OMP_NUM_THREADS=$THREADS")
fi

one_run() {  # $1: label, $2: binary; prints "label name time unit" per benchmark
  "${threads[@]}" "$2" --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_min_time=0.5 2>/dev/null |
    awk -v label="$1" '$1 ~ /_median$/ {sub(/_median$/, "", $1); print label, $1, $2, $3}'
}

results=$(for _ in $(seq "$rounds"); do
  one_run A "$a"
  one_run B "$b"
done)
[ -n "$results" ] || { echo "bench/ab.sh: no benchmark matches '$filter'" >&2; exit 1; }
sort -k2,2 -k1,1 -k3g <<<"$results" | awk '
  function median(list, n,   v) { split(list, v, " "); return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
  { key = $2; runs[$1, key] = runs[$1, key] " " $3; count[$1, key]++; unit[key] = $4 }
  END {
    for (key in unit) {
      ma = median(runs["A", key], count["A", key]); mb = median(runs["B", key], count["B", key])
      printf "%s\n  A (%s):%s  median %.1f\n  B (%s):%s  median %.1f\n  B / A = %.3f\n",
             key, unit[key], runs["A", key], ma, unit[key], runs["B", key], mb, mb / ma
    }
  }'
