#!/usr/bin/env bash
# CTest: a 2-rank job in which rank 1 fails must end with rank 1's message, a non-zero exit
# status, and within 30 seconds (no rank left waiting in a collective).
# Usage: abort.sh <mpiexec> <dist_abort binary>
set -u
start=$(date +%s)
out=$(timeout 120 "$1" -n 2 "$2" 2>&1)
status=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | tail -20
echo "exit status $status after ${elapsed} s"
[ "$status" -ne 0 ] || { echo "FAIL: the job exited 0"; exit 1; }
[ "$status" -ne 124 ] || { echo "FAIL: the job hung until the 120 s timeout"; exit 1; }
[ "$elapsed" -lt 30 ] || { echo "FAIL: took ${elapsed} s"; exit 1; }
echo "$out" | grep -q "accrue-mnist: rank 1: .*train-images-idx3-ubyte" ||
  { echo "FAIL: rank 1's message is missing"; exit 1; }
echo "PASS"
