#!/usr/bin/env bash
# ZeRO's memory and traffic against the formulas of docs/zero.md, on the G2P GPT (CMUdict), per
# rank, in float32 with Adam:
#   memory   at its default width (128) and at --width 512, ZeRO 0 (data parallelism), 1, 2
#            (boundary and micro-step policies) and 3, at 1, 2 and 4 ranks: the model state each
#            rank holds after a step (parameters, gradients, optimizer state; the summary's
#            model_state_bytes, read from the tensors), and the allocator's peak during a window
#            (micro-batch 8, k = 4 on every rank count; and micro-batch 1 for ZeRO 0 and 3,
#            where the activations are fewest, ZeRO-3 with each --zero-prefetch policy);
#   traffic  the bytes each rank hands the collectives per window at k = 1, 4 and 16 (2 and 4
#            ranks, width 128), beside the formula and the ring's wire bytes.
# M is one process's master bytes (4 per parameter, padded as its arena pads them). Writes
# bench/results/zero-cpu.{csv,md,png}. Every rank of a run is one process of this machine.
# Usage: bench/zero.sh BUILD_DIR [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/zero.sh BUILD_DIR [STEPS]}
steps=${2:-2}
data=${ACCRUE_CMUDICT:-data/cmudict/dict.txt}
[ -f "$data" ] || scripts/fetch-cmudict.sh "$(dirname "$data")"
# shellcheck source=scripts/lib/mpi-env.sh
source scripts/lib/mpi-env.sh
out=bench/results/zero-cpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
summary() { grep '"event":"summary"' "$1" | tail -1; }
flags_of() {  # config name -> flags
  case $1 in
    zero0) echo "" ;;
    zero1) echo "--zero 1" ;;
    zero2-boundary) echo "--zero 2 --zero-reduce boundary" ;;
    zero2-micro-step) echo "--zero 2 --zero-reduce micro-step" ;;
    zero3) echo "--zero 3" ;;  # its default prefetch, forward
    zero3-prefetch-none) echo "--zero 3 --zero-prefetch none" ;;
    zero3-prefetch-forward-and-backward) echo "--zero 3 --zero-prefetch forward-and-backward" ;;
  esac
}
run() {  # file, ranks, width, k, config, micro-batch
  local file=$1 ranks=$2 width=$3 k=$4 config=$5 micro=$6
  # shellcheck disable=SC2046
  mpirun -np "$ranks" "$build/examples/accrue-g2p" --data "$data" --width "$width" \
    --micro-batch "$micro" --batch $((micro * k * ranks)) --max-steps "$steps" --epochs 1 --warmup 0 \
    --eval validation --eval-limit 1 --threads 1 --quiet --metrics "$file" \
    $(flags_of "$config") >/dev/null
}
configs="zero0 zero1 zero2-boundary zero2-micro-step zero3"
echo "kind,width,ranks,k,config,parameters,gradients,optimizer_state,total,peak_bytes,all_reduce,reduce_scatter,all_gather,windows" >"$out.csv"
row() {  # kind width ranks k config [micro-batch]
  local f="$tmp/$1-$2-$3-$4-$5.jsonl"
  run "$f" "$3" "$2" "$4" "$5" "${6:-8}"
  summary "$f" | jq -r --arg kind "$1" --arg w "$2" --arg n "$3" --arg k "$4" --arg c "$5" \
    '[$kind, $w, $n, $k, $c, .model_state_bytes.parameters, .model_state_bytes.gradients,
      .model_state_bytes.optimizer_state, .model_state_bytes.total, .peak_bytes,
      .collective_bytes.all_reduce, .collective_bytes.reduce_scatter,
      .collective_bytes.all_gather, .collective_bytes.windows] | @csv' | tr -d '"' >>"$out.csv"
}
for width in 128 512; do
  for ranks in 1 2 4; do
    for config in $configs; do row memory "$width" "$ranks" 4 "$config"; done
  done
done
# Micro-batch 1: the peak with the fewest activations, beside the model state; ZeRO-3 with each
# prefetch policy.
for width in 128 512; do
  for ranks in 1 4; do
    for config in zero0 zero3-prefetch-none zero3 zero3-prefetch-forward-and-backward; do
      row memory-micro-1 "$width" "$ranks" 4 "$config" 1
    done
  done
done
for ranks in 2 4; do
  for k in 1 4 16; do
    for config in $configs; do row traffic 128 "$ranks" "$k" "$config"; done
  done
done
bench/zero-table.sh "$out.csv" >"$out.md"
[ -n "${ACCRUE_SKIP_DEPS:-}" ] || scripts/install-deps.sh --with-plot
bench/plot-zero.sh "$out.csv" "$out.png"
