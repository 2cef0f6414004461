#!/usr/bin/env bash
# The article's table with the G2P model: under one fixed --memory-budget, plain training (the
# largest batch that fits, k = 1), 4-step accumulation, 4-step accumulation with the offloaded
# optimizer, and bf16 with the offloaded optimizer at that effective batch (the budget picks its
# micro-batch), each over the same training samples (the same shuffled order, so the same
# tokens); peak bytes on the device allocator, the micro-batch and effective batch chosen,
# tokens/s, and the validation loss per token after training. Writes
# bench/results/g2p-table-<device>.{csv,md,png}. On a GPU (DEVICE cuda) the budget is the GPU's,
# offloading keeps the optimizer's state in host memory instead, and the ZeRO-3 row needs a GPU
# per rank (it is left out on one GPU).
# Usage: bench/g2p-table.sh BUILD_DIR [BUDGET [SAMPLES [DEVICE]]]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/g2p-table.sh BUILD_DIR [BUDGET [SAMPLES [DEVICE]]]}
budget=${2:-48MiB}
samples=${3:-40960}
device=${4:-cpu}
case "$device" in
  cpu | cuda | cuda:[0-9]*) ;;
  *) echo "g2p-table: DEVICE must be cpu or cuda[:N], got '$device'" >&2; exit 2 ;;
esac
data=${ACCRUE_CMUDICT:-data/cmudict/dict.txt}
[ -f "$data" ] || scripts/fetch-cmudict.sh "$(dirname "$data")"
out=bench/results/g2p-table-${device%%:*}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { grep '"event":"summary"' "$1" | sed -e "s/.*\"$2\":\([^,}]*\).*/\1/" | tr -d '"'; }
epoch_field() { grep '"event":"epoch"' "$1" | tail -1 | sed -e "s/.*\"$2\":\([^,}]*\).*/\1/"; }
zero_ranks=2  # the ZeRO-3 row's ranks (mpirun), each a process of this machine
# shellcheck source=scripts/lib/mpi-env.sh
source scripts/lib/mpi-env.sh
launch=()  # empty: one process; (mpirun -np N): the ZeRO-3 row
run() {  # name, batch, extra flags...
  local name=$1 batch=$2
  shift 2
  local steps=$((samples / batch))
  "${launch[@]}" "$build/examples/accrue-g2p" --data "$data" --memory-budget "$budget" --batch "$batch" \
    --max-steps "$steps" --epochs 1 --eval validation --eval-limit 2000 --warmup 0 --quiet \
    --device "$device" --metrics "$tmp/$name.jsonl" "$@" >/dev/null
  echo "$name,$(field "$tmp/$name.jsonl" peak_bytes),$(field "$tmp/$name.jsonl" micro_batch),$(field "$tmp/$name.jsonl" batch),$(field "$tmp/$name.jsonl" accum_steps),$(field "$tmp/$name.jsonl" tokens_per_second),$(epoch_field "$tmp/$name.jsonl" val_loss),$(field "$tmp/$name.jsonl" offload_to_host_bytes),$steps,$(field "$tmp/$name.jsonl" ranks)"
}
# The largest micro-batch that fits the budget (a power of two dividing 1024), from one probe run.
"$build/examples/accrue-g2p" --data "$data" --memory-budget "$budget" --batch 1024 --max-steps 1 \
  --epochs 1 --eval validation --eval-limit 1 --quiet --device "$device" \
  --metrics "$tmp/probe.jsonl" >/dev/null
# ZeRO-3's ranks each need a device of their own: on a GPU, one GPU per rank.
zero_note="The ZeRO-3 row runs on $zero_ranks ranks (mpirun, every rank a process of this machine): its peak, micro-batch, bytes to host and tokens/s are one rank's (rank 0), its batch the whole window's."
if [ "$device" != cpu ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt "$zero_ranks" ]; then
  zero_ranks=0
  zero_note="The ZeRO-3 row is left out: it needs a GPU per rank, and this machine has fewer than two."
fi
where="On a CPU the \"device\" and the \"host\" are the same memory: offloading shows the bytes moved, not a speed-up."
[ "$device" = cpu ] || where="The budget is the GPU's memory; offloading keeps the optimizer's state and step in pinned host memory."
micro=$(field "$tmp/probe.jsonl" micro_batch)
{
  echo "config,peak_bytes,micro_batch,batch,accum_steps,tokens_per_second,val_loss,offload_to_host_bytes,steps,ranks"
  run plain "$micro"
  run accumulate_4 $((4 * micro))
  run accumulate_4_offload $((4 * micro)) --offload-optimizer
  run bf16_accumulate_offload $((4 * micro)) --offload-optimizer --precision bf16
  if [ "$zero_ranks" -gt 0 ]; then
    launch=(mpirun -np "$zero_ranks")
    run "zero3_offload_${zero_ranks}_ranks" $((4 * micro * zero_ranks)) --zero 3 \
      --offload-optimizer
    launch=()
  fi
} > "$out.csv"
{
  echo "G2P GPT (4 x 128, 815k parameters) on $device under --memory-budget $budget, $samples training samples each (\`bench/g2p-table.sh\`). $where $zero_note"
  echo
  echo "| config | peak bytes | micro-batch x k = batch | tokens/s | validation loss / token | bytes to host per run | steps |"
  echo "|---|---|---|---|---|---|---|"
  tail -n +2 "$out.csv" | awk -F, '{
    printf "| %s | %.1f MiB | %s x %s%s = %s | %.0f | %.4f | %.1f MiB | %s |\n",
      $1, $2 / 1048576, $3, $5, ($10 > 1 ? " x " $10 " ranks" : ""), $4, $6, $7, $8 / 1048576, $9 }'
} > "$out.md"
[ -n "${ACCRUE_SKIP_DEPS:-}" ] || scripts/install-deps.sh --with-plot
# A machine that cannot install gnuplot (the GPU machine) keeps the table without the plot.
command -v gnuplot > /dev/null || { echo "g2p-table: no gnuplot, $out.png not drawn"; exit 0; }
bench/plot-g2p-table.sh "$out.csv" "$out.png" \
  "G2P GPT under --memory-budget $budget ($device): the same $samples samples per configuration"
