#!/usr/bin/env bash
# CTest: ranks started with different settings are stopped before they train (#22). Each case
# is an MPMD launch whose two ranks differ in one setting; the job must exit 1 within 30 s
# naming that setting (not crash in the all-reduce, hang, or exit 0 with diverged weights).
# Usage: disagree.sh <mpiexec> <dist_cli binary>
set -u
mpiexec=$1
cli=$2
common=(--epochs 1 --micro-batch 8 --accum-steps 2 --threads 1 --quiet --device cpu)
failed=0
check() {  # name, expected words, then the two ranks' "samples args..." separated by ':'
  local name=$1 words=$2
  shift 2
  local start
  start=$(date +%s)
  out=$(timeout 120 "$mpiexec" "$@" 2>&1)
  local status=$? elapsed=$(( $(date +%s) - start ))
  if [ "$status" -eq 0 ] || [ "$status" -eq 124 ] || [ "$elapsed" -ge 30 ] ||
     ! echo "$out" | grep -q "$words"; then
    echo "FAIL $name: exit status $status after ${elapsed} s; expected '$words' in:"
    echo "$out" | tail -8
    failed=1
  else
    echo "PASS $name: exit status $status after ${elapsed} s: $(echo "$out" | grep -m1 "$words")"
  fi
}
check "model width" "the ranks disagree on task.hidden" \
  -n 1 "$cli" 512 "${common[@]}" --hidden 32 : -n 1 "$cli" 512 "${common[@]}" --hidden 64
check "learning rate" "the ranks disagree on lr" \
  -n 1 "$cli" 512 "${common[@]}" --lr 0.001 : -n 1 "$cli" 512 "${common[@]}" --lr 0.002
check "seed" "the ranks disagree on seed" \
  -n 1 "$cli" 512 "${common[@]}" --seed 1 : -n 1 "$cli" 512 "${common[@]}" --seed 2
check "sample count" "the ranks disagree on train_samples" \
  -n 1 "$cli" 512 "${common[@]}" : -n 1 "$cli" 640 "${common[@]}"
# Checked before the ranks are split into stages: no wait for the watchdog (D3).
check "pipeline stages" "the ranks disagree on pipeline" \
  -n 1 "$cli" 512 "${common[@]}" --pipeline 2 : -n 1 "$cli" 512 "${common[@]}"
# Flags that change which collectives run when: named before the first window instead of a hang.
check "ZeRO-3 prefetch" "the ranks disagree on zero_prefetch" \
  -n 1 "$cli" 512 "${common[@]}" --zero 3 --zero-prefetch forward-and-backward : \
  -n 1 "$cli" 512 "${common[@]}" --zero 3
check "ZeRO-2 reduction" "the ranks disagree on zero_reduce" \
  -n 1 "$cli" 512 "${common[@]}" --zero 2 --zero-reduce micro-step : \
  -n 1 "$cli" 512 "${common[@]}" --zero 2
check "evaluation cadence" "the ranks disagree on eval_every" \
  -n 1 "$cli" 512 "${common[@]}" --eval-every 5 : -n 1 "$cli" 512 "${common[@]}"
# Not a disagreement, but the same launcher: --memory-budget on 3 ranks suggests batches it takes.
check "memory budget on 3 ranks" "nearest: --batch 126 or --batch 129" \
  -n 3 "$cli" 512 --memory-budget 64MiB --epochs 1 --threads 1 --quiet --device cpu
[ "$failed" -eq 0 ] && echo "PASS" || exit 1
