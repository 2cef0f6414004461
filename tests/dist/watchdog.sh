#!/usr/bin/env bash
# CTest: a rank that stops (SIGSTOP after step 3) must not leave the other waiting forever: with
# --comm-timeout 3 the waiting rank's watchdog names the operation and itself, and the job ends
# within 30 s with a non-zero status (#22).
# Usage: watchdog.sh <mpiexec> <dist_cli binary> [more accrue-mnist flags, e.g. --pipeline 2]
set -u
start=$(date +%s)
out=$(DIST_CLI_SIGSTOP_AT=1:3 timeout 120 "$1" -n 2 -x DIST_CLI_SIGSTOP_AT "$2" 512 --epochs 50 \
      --micro-batch 8 --accum-steps 2 --threads 1 --quiet --device cpu --comm-timeout 3 "${@:3}" 2>&1)
status=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | tail -12
echo "exit status $status after ${elapsed} s"
[ "$status" -ne 0 ] || { echo "FAIL: the job exited 0"; exit 1; }
[ "$status" -ne 124 ] || { echo "FAIL: the job hung until the 120 s timeout"; exit 1; }
[ "$elapsed" -lt 30 ] || { echo "FAIL: took ${elapsed} s"; exit 1; }
echo "$out" | grep -q "accrue-mnist: rank 0: \[watchdog\] rank 0: MPI .* did not complete within 3 s" ||
  { echo "FAIL: rank 0's watchdog message is missing"; exit 1; }
echo "PASS"
