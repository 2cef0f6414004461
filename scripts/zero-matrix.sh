#!/usr/bin/env bash
# The whole ZeRO matrix, outside CI: every stage (1, 2 with either reduce policy, 3), with and
# without --offload-optimizer, at every power-of-two k that splits a rank's share (up to 16),
# for the MNIST MLP and the G2P GPT in float64 against one process, and in float32, bfloat16 and
# float16 against data parallelism, with bitwise resume, at 2 and 4 ranks. CI runs the same
# tests with k = 1 and one k > 1 (dist.zero_two_ranks, dist.zero_four_ranks).
# Usage: scripts/zero-matrix.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: scripts/zero-matrix.sh BUILD_DIR}
# shellcheck source=scripts/lib/mpi-env.sh
source "$(dirname "$0")/lib/mpi-env.sh"
export ACCRUE_ZERO_MATRIX=1
for ranks in 2 4; do
  start=$(date +%s.%N)
  mpirun -np "$ranks" "$build/tests/test_dist_zero" --gtest_brief=1
  echo "zero-matrix: $ranks ranks passed in $(echo "$(date +%s.%N) - $start" | bc) s"
done
