#!/usr/bin/env bash
# Checks that a refactor changes no result: builds BASE (a commit) in a git worktree and the
# current tree, both on this machine with the same options, trains the same short runs with each
# accrue-mnist and compares the saved weights byte for byte with cmp. Bits differ between CPUs,
# so only files written on one machine are ever compared.
#
# Usage: scripts/refactor-check.sh BASE [DATA]     (DATA: the MNIST folder, default data/mnist)
# Environment: REFCHECK_DIR (default build-refcheck, relative to the repository's root) holds the
# worktree, both builds and the runs' files; BASE_BUILD / HEAD_BUILD reuse existing CPU Release
# build folders instead.
# Exit status: 0 when every pair is identical, 1 when any differs or a run fails, 2 on a usage
# error (one line, before anything is installed or built).
set -euo pipefail
# shellcheck source=scripts/lib/compare-builds.sh
source "$(dirname "$0")/lib/compare-builds.sh"
base_and_data refactor-check "$@"
scripts/install-deps.sh
dir=$(realpath -m "${REFCHECK_DIR:-build-refcheck}")
mkdir -p "$dir"
two_builds "$base" "$dir" refactor-check

# name | ranks | arguments (the weights go to --save, added below)
runs=(
  "default|1|"
  "fp16|1|--precision fp16"
  "cnn-batch|1|--model cnn --norm batch"
  "zero1-2ranks|2|--zero 1"
  "buckets64-2ranks|2|--bucket-kib 64"
  "offload|1|--offload-optimizer"
  "accum-schedule|1|--accum-schedule 1:1,2:4 --train-limit 4096"
)
common=(--data "$data" --seed 1 --threads 2 --quiet)
mpi=(mpirun --allow-run-as-root --oversubscribe -np 2)

run() {  # run BUILD OUT RANKS ARGS...
  local bin="$1/examples/accrue-mnist" out=$2 ranks=$3
  shift 3
  if [ "$ranks" = 2 ]; then "${mpi[@]}" "$bin" "${common[@]}" "$@" >"$out.log" 2>&1
  else "$bin" "${common[@]}" "$@" >"$out.log" 2>&1; fi
}

failed=0
compare() {  # compare NAME
  if cmp -s "$dir/base/$1.safetensors" "$dir/head/$1.safetensors"; then
    echo "refactor-check: $1: identical ($(stat -c %s "$dir/head/$1.safetensors") bytes)"
  else
    echo "refactor-check: $1: DIFFERENT"
    failed=1
  fi
}
for side in base head; do rm -rf "${dir:?}/$side"; mkdir -p "$dir/$side"; done
for entry in "${runs[@]}"; do
  IFS='|' read -r name ranks args <<<"$entry"
  for side in base head; do
    b=$base_build
    [ $side = head ] && b=$head_build
    # shellcheck disable=SC2086
    if ! run "$b" "$dir/$side/$name" "$ranks" --max-steps 300 $args --save "$dir/$side/$name.safetensors"; then
      echo "refactor-check: $name failed on $side (see $dir/$side/$name.log)"
      failed=1
    fi
  done
  compare "$name"
done
# A checkpoint at step 100 of 150, resumed to 300: the resumed run's weights.
for side in base head; do
  b=$base_build
  [ $side = head ] && b=$head_build
  out="$dir/$side/resume"
  run "$b" "$out-first" 1 --max-steps 150 --checkpoint "$out.ckpt" --checkpoint-every 100 &&
    run "$b" "$out" 1 --max-steps 300 --resume "$out.ckpt" --save "$out.safetensors" ||
    { echo "refactor-check: resume failed on $side (see $out*.log)"; failed=1; }
done
compare resume
exit $failed
