#!/usr/bin/env bash
# The ZeRO strategies on one device in a world of one rank (gpu-check.sh's "zero" mode on a GPU;
# runs as well on the CPU): every stage, policy and offload trains the MNIST MLP and the G2P GPT
# (tied head) for a few steps, and each step's loss stays within 1e-4 relative of the plain run's.
# With one rank the collectives are copies, so this checks what the device does: the released
# and reacquired gradient and layer buffers, the layer-by-layer window, the restricted copies to
# and from the host. Prints one line per run; exit 1 when any differs or fails.
# Usage: scripts/lib/zero-smoke.sh DEVICE BUILD_DIR MNIST_DIR CMUDICT OUT_DIR
set -uo pipefail
[ $# -eq 5 ] || { echo "usage: zero-smoke.sh DEVICE BUILD_DIR MNIST_DIR CMUDICT OUT_DIR" >&2; exit 2; }
device=$1 build=$2 mnist=$3 dict=$4 out=$5
mkdir -p "$out"
status=0
compare() {  # name reference.jsonl run.jsonl
  python3 - "$@" <<'PY' || status=1
import json, sys
name, ref, got = sys.argv[1:4]
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "event" not in r and "loss" in r]
a, b = losses(ref), losses(got)
worst = max((abs(x - y) / abs(y) for x, y in zip(b, a)), default=float("inf"))
ok = len(a) == len(b) and len(a) > 0 and worst <= 1e-4
print(f"zero-smoke: {name}: {len(b)} steps, largest relative loss difference {worst:.2e}"
      f" {'ok' if ok else 'DIFFERS'}")
sys.exit(0 if ok else 1)
PY
}
run() {  # program name flags...
  local program=$1 name=$2
  shift 2
  local args=(--device "$device" --quiet --metrics "$out/$name.jsonl")
  if [ "$program" = mnist ]; then
    args+=(--data "$mnist" --max-steps 30 --micro-batch 32 --accum-steps 4)
  else
    args+=(--data "$dict" --max-steps 20 --micro-batch 16 --accum-steps 4 --eval-limit 50)
  fi
  rm -f "$out/$name.jsonl"
  if ! "$build/examples/accrue-$program" "${args[@]}" "$@" > "$out/$name.log" 2>&1; then
    echo "zero-smoke: $name FAILED: $(tail -1 "$out/$name.log")"
    status=1
    return 1
  fi
}
for program in mnist g2p; do
  for precision in fp32 bf16; do
    base="$program-$precision"
    run "$program" "$base-plain" --precision "$precision" || continue
    for zero in "1" "2 --zero-reduce boundary" "2 --zero-reduce micro-step" "3" \
      "1 --offload-optimizer" "2 --zero-reduce micro-step --offload-optimizer" \
      "3 --offload-optimizer" "3 --zero-prefetch forward-and-backward"; do
      name="$base-zero-${zero// /_}"
      # shellcheck disable=SC2086
      run "$program" "$name" --precision "$precision" --zero $zero &&
        compare "$name" "$out/$base-plain.jsonl" "$out/$name.jsonl"
    done
  done
done
exit "$status"
