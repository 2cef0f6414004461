#!/usr/bin/env bash
# Times one epoch of the default MNIST recipe with --threads 0 (tuned) and --threads 1,
# alternating, five runs each, first with the machine idle and then with one competing busy
# process; prints each run's train_seconds (from --metrics) and the medians.
# Usage: bench/threads.sh [build dir, default build-bench] [data dir, default data/mnist]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
data=${2:-data/mnist}
runs=${RUNS:-5}
[ -x "$build/examples/accrue-mnist" ] || cmake --build "$build" --target accrue-mnist >/dev/null
[ -f "$data/train-images-idx3-ubyte" ] || scripts/fetch-mnist.sh "$data"
metrics=$(mktemp)
trap 'rm -f "$metrics"; [ -n "${busy:-}" ] && kill "$busy" 2>/dev/null || true' EXIT

epoch_seconds() {  # $1: --threads value
  "$build/examples/accrue-mnist" --data "$data" --epochs 1 --threads "$1" --quiet \
    --metrics "$metrics" >/dev/null
  grep '"event":"summary"' "$metrics" | sed -e 's/.*"train_seconds":\([0-9.e+-]*\).*/\1/'
}
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

measure() {  # $1: label
  local zero=() one=()
  for _ in $(seq "$runs"); do
    zero+=("$(epoch_seconds 0)")
    one+=("$(epoch_seconds 1)")
  done
  local mz mo
  mz=$(printf '%s\n' "${zero[@]}" | median)
  mo=$(printf '%s\n' "${one[@]}" | median)
  echo "$1: --threads 0: ${zero[*]} s (median $mz); --threads 1: ${one[*]} s (median $mo);" \
    "ratio $(awk -v a="$mz" -v b="$mo" 'BEGIN {printf "%.3f", a / b}')"
}

measure "idle"
sh -c 'while :; do :; done' &
busy=$!
measure "one busy process"
