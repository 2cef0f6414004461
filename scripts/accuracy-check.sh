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
# Environment: ACCURACY_SEEDS (default "1 2 3 4 5 6 7 8 9 10": whole numbers, each once, 1, 2
# and 3 among them), ACCURACY_ARGS (more accrue-mnist flags, split at spaces, e.g. "--model cnn
# --norm group"), ACCURACY_DIR (default build-accuracy, relative to the repository's root) for the
# worktree and both builds; BASE_BUILD / HEAD_BUILD reuse existing CPU Release build folders
# instead.
# Exit status: 0 when seeds 1-3 are each within 0.15 points, 1 when not or a run fails, 2 on a
# usage error (one line, before anything is installed or built).
set -euo pipefail
set -f  # the seeds and ACCURACY_ARGS are split at spaces, never expanded as file names
# shellcheck source=scripts/lib/compare-builds.sh
source "$(dirname "$0")/lib/compare-builds.sh"
base_and_data accuracy-check "$@"
IFS=$' \t\n' read -r -d '' -a seeds <<<"${ACCURACY_SEEDS:-1 2 3 4 5 6 7 8 9 10}" || true
listed=" "
for s in "${seeds[@]}"; do
  # accrue-mnist takes seeds below 2^64; 19 digits at most keeps them there
  [[ "$s" =~ ^(0|[1-9][0-9]{0,18})$ ]] ||
    { echo "accuracy-check: seed '$s' is not a whole number below 10^19" >&2; exit 2; }
  [[ "$listed" != *" $s "* ]] || { echo "accuracy-check: seed $s is listed twice" >&2; exit 2; }
  listed+="$s "
done
for s in 1 2 3; do
  [[ "$listed" == *" $s "* ]] || { echo "accuracy-check: ACCURACY_SEEDS must include 1, 2 and 3" >&2; exit 2; }
done
scripts/install-deps.sh
dir=$(realpath -m "${ACCURACY_DIR:-build-accuracy}")
mkdir -p "$dir"
two_builds "$base" "$dir" accuracy-check

accuracy() {  # accuracy BUILD SEED: the summary's test accuracy in percent
  local metrics="$dir/metrics.jsonl" value
  rm -f "$metrics"
  # shellcheck disable=SC2086
  "$1/examples/accrue-mnist" --data "$data" --threads 0 --quiet --seed "$2" \
    ${ACCURACY_ARGS:-} --metrics "$metrics" >"$dir/run.log" 2>&1 ||
    { echo "accuracy-check: seed $2 failed with $1 (see $dir/run.log)" >&2; return 1; }
  # exactly one summary with a number, or the run is not counted
  value=$(sed -n '/"event":"summary"/s/.*"test_accuracy":\([0-9.eE+-]*\).*/\1/p' "$metrics" \
    2>/dev/null || true)
  [[ "$value" =~ ^[0-9.eE+-]+$ ]] ||
    { echo "accuracy-check: seed $2 with $1: no test accuracy in the run's summary ($metrics)" >&2; return 1; }
  awk -v v="$value" 'BEGIN { printf "%.2f\n", 100 * v }'
}

echo "Default recipe${ACCURACY_ARGS:+ with $ACCURACY_ARGS}, test accuracy (%): $base${BASE_BUILD:+ (as built in $BASE_BUILD)} against ${HEAD_BUILD:-the current tree}:"
echo
echo "| seed | base | this tree | difference |"
echo "|---|---|---|---|"
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for s in "${seeds[@]}"; do
  a=$(accuracy "$base_build" "$s")
  b=$(accuracy "$head_build" "$s")
  echo "$s $a $b" >>"$rows"
  awk -v s="$s" -v a="$a" -v b="$b" 'BEGIN { printf "| %s | %s | %s | %+.2f |\n", s, a, b, b - a }'
done
echo
awk '{ seed[NR] = $1; d[NR] = $3 - $2 }
     END { n = NR; for (i = 1; i <= n; i++) sum += d[i]
           mean = sum / n
           for (i = 1; i <= n; i++) {
             sq += (d[i] - mean) ^ 2
             size = d[i] < 0 ? -d[i] : d[i]
             if (size > big) big = size
             if (seed[i] >= 1 && seed[i] <= 3 && size > 0.15 + 1e-9) out++
           }
           sd = n > 1 ? sqrt(sq / (n - 1)) : 0
           printf "Differences over %d seeds: mean %+.3f, standard deviation %.3f, largest %.2f.\n",
                  n, mean, sd, big
           printf "Seeds 1-3 within 0.15 points: %s.\n", out ? "no" : "yes"
           exit out ? 1 : 0 }' "$rows"
