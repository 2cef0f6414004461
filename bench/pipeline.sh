#!/usr/bin/env bash
# The pipeline's bubble and memory, measured: the G2P GPT (4 blocks x 128) on one process and cut
# into two stages on two ranks (mpirun -np 2, one thread per rank), for k = 2, 4, 8, 16
# micro-batches per window under GPipe and 1F1B. Per stage: the idle share of the window time
# (waiting for the neighbour) against the bubble (P - 1) / (k + P - 1), and the peak activation
# bytes (GPipe holds k micro-batches, 1F1B P - s) against that theory; tokens/s beside one
# process. Writes bench/results/pipeline-cpu.{csv,md,png}.
# Usage: bench/pipeline.sh BUILD_DIR [STEPS [MICRO_BATCH]]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: bench/pipeline.sh BUILD_DIR [STEPS [MICRO_BATCH]]}
steps=${2:-24}
micro=${3:-16}
data=${ACCRUE_CMUDICT:-data/cmudict/dict.txt}
[ -f "$data" ] || scripts/fetch-cmudict.sh "$(dirname "$data")"
out=bench/results/pipeline-cpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=scripts/lib/mpi-env.sh
source scripts/lib/mpi-env.sh
field() { grep "\"event\":\"$2\"" "$1" | tail -1 | sed -e "s/.*\"$3\":\([^,}]*\).*/\1/"; }
stage() { grep '"event":"pipeline"' "$1" | sed -e 's/.*"stages":\[//' | tr '}' '\n' |
  grep "\"stage\":$2" | sed -e "s/.*\"$3\":\([^,}]*\).*/\1/"; }
g2p() {  # metrics file, ranks, flags...
  local metrics=$1 ranks=$2
  shift 2
  local cmd=("$build/examples/accrue-g2p" --data "$data" --threads 1 --micro-batch "$micro"
    --max-steps "$steps" --epochs 1 --eval validation --eval-limit 1 --warmup 0 --seed 1 --quiet
    --metrics "$metrics" "$@")
  if [ "$ranks" -gt 1 ]; then mpirun -np "$ranks" "${cmd[@]}" >/dev/null; else "${cmd[@]}" >/dev/null; fi
}
{
  echo "k,schedule,tokens_per_second_p1,tokens_per_second_p2,idle_stage0,idle_stage1,bubble_theory,peak_stage0,peak_stage1"
  for k in 2 4 8 16; do
    g2p "$tmp/p1-$k.jsonl" 1 --accum-steps "$k"
    for schedule in gpipe 1f1b; do
      m="$tmp/p2-$k-$schedule.jsonl"
      g2p "$m" 2 --accum-steps "$k" --pipeline 2 --pipeline-schedule "$schedule"
      echo "$k,$schedule,$(field "$tmp/p1-$k.jsonl" summary tokens_per_second),$(field "$m" summary tokens_per_second),$(stage "$m" 0 idle_fraction),$(stage "$m" 1 idle_fraction),$(awk -v k="$k" 'BEGIN { print 1 / (k + 1) }'),$(stage "$m" 0 peak_activation_bytes),$(stage "$m" 1 peak_activation_bytes)"
    done
  done
} > "$out.csv"
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
{
  echo "G2P GPT (4 blocks x 128) on $cpu, micro-batch $micro, $steps steps per run, one thread per rank (\`bench/pipeline.sh\`). P = 2: stage 0 holds the embeddings and blocks 0-1, stage 1 blocks 2-3 and the tied head. Idle: the share of a stage's window time spent waiting for the other stage; theory: the bubble (P - 1) / (k + P - 1). Peak: activation bytes above the window's start; theory: GPipe holds k micro-batches on every stage, 1F1B P - s."
  echo
  echo "| k | schedule | tokens/s P=1 | tokens/s P=2 | idle stage 0 | idle stage 1 | bubble theory | peak stage 0 | peak stage 1 |"
  echo "|---|---|---|---|---|---|---|---|---|"
  tail -n +2 "$out.csv" | awk -F, '{
    printf "| %s | %s | %.0f | %.0f | %.1f%% | %.1f%% | %.1f%% | %.2f MiB | %.2f MiB |\n",
      $1, $2, $3, $4, 100 * $5, 100 * $6, 100 * $7, $8 / 1048576, $9 / 1048576 }'
} > "$out.md"
[ -n "${ACCRUE_SKIP_DEPS:-}" ] || scripts/install-deps.sh --with-plot
bench/plot-pipeline.sh "$out.csv" "$out.png" "$cpu"
echo "wrote $out.csv, $out.md, $out.png"
