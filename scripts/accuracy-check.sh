#!/usr/bin/env bash
# Checks that a change which alters the last bits of training (a faster kernel, another summation
# order) leaves accuracy where it was: builds BASE (a commit) in a git worktree and the current
# tree, both on this machine with the same options, trains the default MNIST recipe (5 epochs)
# with each accrue-mnist for every seed, and prints per seed the two test accuracies and their
# difference, then the differences' mean, standard deviation and largest size.
#
# The criterion of CPU speed work (issue #24): seeds 1, 2 and 3 each within 0.15 points of BASE.
# A seed's accuracy moves by more than that under any last-bit change (bench/results/
# accuracy-seeds-*.md), so the other seeds' spread is printed beside it as the scale.
#
# Usage: scripts/accuracy-check.sh BASE [DATA]     (DATA: the MNIST folder, default data/mnist)
# Environment: ACCURACY_SEEDS (default "1 2 3 4 5 6 7 8 9 10"; must include 1, 2 and 3),
# ACCURACY_ARGS (more accrue-mnist flags, e.g. "--model cnn --norm group"), ACCURACY_DIR (default
# build-accuracy) for the worktree and both builds; BASE_BUILD / HEAD_BUILD reuse existing CPU
# Release build folders instead.
# Exit status: 0 when seeds 1-3 are each within 0.15 points, 1 when not or a run fails, 2 on a
# usage error.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/accuracy-check.sh BASE [DATA]" >&2; exit 2; }
base=$(git rev-parse --verify -q "$1^{commit}") || { echo "accuracy-check: $1 is not a commit" >&2; exit 2; }
data=$(realpath "${2:-data/mnist}")
[ -f "$data/train-images-idx3-ubyte" ] || { echo "accuracy-check: no MNIST in $data (scripts/fetch-mnist.sh $data)" >&2; exit 2; }
seeds=${ACCURACY_SEEDS:-1 2 3 4 5 6 7 8 9 10}
for s in 1 2 3; do
  [[ " $seeds " == *" $s "* ]] || { echo "accuracy-check: ACCURACY_SEEDS must include 1, 2 and 3" >&2; exit 2; }
done
for s in $seeds; do
  [[ "$s" =~ ^[0-9]+$ ]] || { echo "accuracy-check: seed '$s' is not a whole number" >&2; exit 2; }
done
scripts/install-deps.sh
dir=$(realpath -m "${ACCURACY_DIR:-build-accuracy}")
mkdir -p "$dir"
# shellcheck source=scripts/lib/two-builds.sh
source scripts/lib/two-builds.sh
two_builds "$base" "$dir" accuracy-check

accuracy() {  # accuracy BUILD SEED: the summary's test accuracy in percent
  local metrics="$dir/metrics.jsonl"
  rm -f "$metrics"
  # shellcheck disable=SC2086
  "$1/examples/accrue-mnist" --data "$data" --threads 0 --quiet --seed "$2" \
    ${ACCURACY_ARGS:-} --metrics "$metrics" >"$dir/run.log" 2>&1 ||
    { echo "accuracy-check: seed $2 failed with $1 (see $dir/run.log)" >&2; return 1; }
  grep '"event":"summary"' "$metrics" |
    sed -e 's/.*"test_accuracy":\([0-9.e+-]*\).*/\1/' | awk '{printf "%.2f\n", 100 * $1}'
}

echo "Default recipe${ACCURACY_ARGS:+ with $ACCURACY_ARGS}, test accuracy (%): $base${BASE_BUILD:+ (as built in $BASE_BUILD)} against ${HEAD_BUILD:-the current tree}:"
echo
echo "| seed | base | this tree | difference |"
echo "|---|---|---|---|"
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for s in $seeds; do
  a=$(accuracy "$base_build" "$s")
  b=$(accuracy "$head_build" "$s")
  echo "$s $a $b" >>"$rows"
  awk -v s="$s" -v a="$a" -v b="$b" 'BEGIN { printf "| %s | %s | %s | %+.2f |\n", s, a, b, b - a }'
done
echo
awk '{ d = $3 - $2; n++; sum += d; sq += d * d; if (d < 0) d = -d; if (d > big) big = d
       if (($1 == 1 || $1 == 2 || $1 == 3) && d > 0.15 + 1e-9) out++ }
     END { mean = sum / n; sd = n > 1 ? sqrt((sq - n * mean * mean) / (n - 1)) : 0
           printf "Differences over %d seeds: mean %+.3f, standard deviation %.3f, largest %.2f.\n", n, mean, sd, big
           printf "Seeds 1-3 within 0.15 points: %s.\n", out ? "no" : "yes"
           exit out ? 1 : 0 }' "$rows"
