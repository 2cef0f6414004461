#!/usr/bin/env bash
# Checks that a refactor changes no result: builds BASE (a commit) in a git worktree and the
# current tree, both on this machine with the same options, trains the same short runs with each
# accrue-mnist and accrue-g2p and compares the saved weights byte for byte with cmp, and each
# run's output and metrics once their timing fields are taken out (normalise() below lists them).
# A checkpoint BASE wrote is also resumed by the current tree. Bits differ between CPUs, so only
# files written on one machine are ever compared.
#
# Usage: scripts/refactor-check.sh BASE [DATA]     (DATA: the MNIST folder, default data/mnist)
# Environment: REFCHECK_CMUDICT (default data/cmudict/dict.txt) is CMUdict for the G2P runs;
# REFCHECK_DIR (default build-refcheck, relative to the repository's root) holds the worktree,
# both builds and the runs' files; BASE_BUILD / HEAD_BUILD reuse existing CPU Release build
# folders instead.
# Exit status: 0 when every pair is identical, 1 when any differs or a run fails, 2 on a usage
# error (one line, before anything is installed or built).
set -euo pipefail
# shellcheck source=scripts/lib/compare-builds.sh
source "$(dirname "$0")/lib/compare-builds.sh"
base_and_data refactor-check "$@"
dict=$(realpath -m -- "${REFCHECK_CMUDICT:-data/cmudict/dict.txt}")
[ -f "$dict" ] || { echo "refactor-check: no CMUdict at $dict (scripts/fetch-cmudict.sh)" >&2; exit 2; }
scripts/install-deps.sh
dir=$(realpath -m "${REFCHECK_DIR:-build-refcheck}")
mkdir -p "$dir"
build_targets=(accrue-g2p)
two_builds "$base" "$dir" refactor-check

# name | program | ranks | arguments (the weights go to --save, the metrics to --metrics)
g2p_small="--train-limit 4096 --layers 2 --width 64 --eval-limit 50"
runs=(
  "default|mnist|1|--max-steps 300"
  "fp16|mnist|1|--max-steps 300 --precision fp16"
  "cnn-batch|mnist|1|--max-steps 300 --model cnn --norm batch"
  "zero1-2ranks|mnist|2|--max-steps 300 --zero 1"
  "zero1-bf16-2ranks|mnist|2|--max-steps 300 --zero 1 --precision bf16"
  "buckets64-2ranks|mnist|2|--max-steps 300 --bucket-kib 64"
  "offload|mnist|1|--max-steps 300 --offload-optimizer"
  "accum-schedule|mnist|1|--max-steps 300 --accum-schedule 1:1,2:4 --train-limit 4096"
  "g2p|g2p|1|--max-steps 40 $g2p_small"
  "g2p-offload|g2p|1|--max-steps 40 $g2p_small --offload-optimizer"
  "g2p-gpipe-2ranks|g2p|2|--max-steps 40 $g2p_small --pipeline 2 --pipeline-schedule gpipe"
  "g2p-1f1b-2ranks|g2p|2|--max-steps 40 $g2p_small --pipeline 2 --pipeline-schedule 1f1b"
)
mpi=(mpirun --allow-run-as-root --oversubscribe -np 2)

run() {  # run BUILD OUT PROGRAM RANKS ARGS...
  local bin="$1/examples/accrue-$3" out=$2 ranks=$4 common
  shift 4
  common=(--data "$data" --seed 1 --threads 2)
  [ "$(basename "$bin")" = accrue-g2p ] && common=(--data "$dict" --seed 1 --threads 2)
  if [ "$ranks" = 2 ]; then "${mpi[@]}" "$bin" "${common[@]}" "$@" >"$out.log" 2>&1
  else "$bin" "${common[@]}" "$@" >"$out.log" 2>&1; fi
}

# A run's output and metrics without what varies from run to run: times, rates, thread counts,
# the paths of its own files, the run's random id, and the progress (on a terminal, as under
# mpirun, its bar is redrawn by the clock, and elsewhere its step lines are printed by the
# clock, so which steps it shows varies).
normalise() {  # normalise FILE
  sed -E -e 's/\r/\n/g' "$1" | sed -E -e '/^epoch [0-9]+ \[/d' -e '/^epoch [0-9]+ step [0-9]+ \(/d' \
    -e 's/"run_id":"[0-9a-f]+"/"run_id":ID/g' -e "s#$dir/(base|head)#DIR#g" \
    -e 's/[0-9]+(\.[0-9]+)? (s|samples\/s|tokens\/s)\b/T \2/g' \
    -e 's/"(seconds|eval_seconds|train_seconds|first_window_seconds|samples_per_second|tokens_per_second|busy_seconds|wait_seconds|idle_fraction|thread_switches|threads)":[^,}]*/"\1":T/g' \
    -e 's/idle [0-9.]+% of T s/idle T% of T s/g'
}

failed=0
compare() {  # compare NAME: the weights, then the output and the metrics (when both exist)
  local what
  if cmp -s "$dir/base/$1.safetensors" "$dir/head/$1.safetensors"; then
    echo "refactor-check: $1: identical ($(stat -c %s "$dir/head/$1.safetensors") bytes)"
  else
    echo "refactor-check: $1: DIFFERENT"
    failed=1
  fi
  for what in log jsonl; do
    [ -f "$dir/base/$1.$what" ] && [ -f "$dir/head/$1.$what" ] || continue
    if ! diff <(normalise "$dir/base/$1.$what") <(normalise "$dir/head/$1.$what") \
      >"$dir/$1.$what.diff"; then
      echo "refactor-check: $1: the $what DIFFERS (see $dir/$1.$what.diff)"
      failed=1
    fi
  done
}
for side in base head; do rm -rf "${dir:?}/$side"; mkdir -p "$dir/$side"; done
for entry in "${runs[@]}"; do
  IFS='|' read -r name program ranks args <<<"$entry"
  for side in base head; do
    b=$base_build
    [ $side = head ] && b=$head_build
    out="$dir/$side/$name"
    # shellcheck disable=SC2086
    if ! run "$b" "$out" "$program" "$ranks" $args --save "$out.safetensors" \
      --metrics "$out.jsonl"; then
      echo "refactor-check: $name failed on $side (see $out.log)"
      failed=1
    fi
  done
  compare "$name"
done
# A checkpoint at step 100 of 150, resumed to 300 (the resumed run's weights), and BASE's
# checkpoint resumed by the current tree ("resume-of-base", against BASE resuming its own).
for side in base head; do
  b=$base_build
  [ $side = head ] && b=$head_build
  out="$dir/$side/resume"
  run "$b" "$out-first" mnist 1 --max-steps 150 --checkpoint "$out.ckpt" --checkpoint-every 100 &&
    run "$b" "$out" mnist 1 --max-steps 300 --resume "$out.ckpt" --save "$out.safetensors" ||
    { echo "refactor-check: resume failed on $side (see $out*.log)"; failed=1; }
done
compare resume
cp "$dir/base/resume.safetensors" "$dir/base/resume-of-base.safetensors"
run "$head_build" "$dir/head/resume-of-base" mnist 1 --max-steps 300 \
  --resume "$dir/base/resume.ckpt" --save "$dir/head/resume-of-base.safetensors" ||
  { echo "refactor-check: resume-of-base failed (see $dir/head/resume-of-base.log)"; failed=1; }
compare resume-of-base
exit $failed
