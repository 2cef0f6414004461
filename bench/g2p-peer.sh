#!/usr/bin/env bash
# accrue-g2p against its libtorch peer (bench/peers/torch_g2p.cpp), in one run on this machine:
#  1. the same model: accrue-g2p writes its initial weights (--save-init); the peer loads them
#     and must match accrue's first step (loss and gradient norm, file order, no update) to 1e-5;
#  2. the same training: both train the first STEPS windows of the default recipe from those
#     weights (the same windows, micro-batches and schedule), alternating, median of REPS runs
#     per thread setting; tokens/s counts non-padding input tokens;
#  3. the floor: the GEMM FLOPs of those steps (counted by the peer over the padded
#     micro-batches) at the same-run large-GEMM rate (accrue-bench's limits).
# Writes bench/results/g2p-peer-cpu.md. Usage: bench/g2p-peer.sh [STEPS (100)] [REPS (3)]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-100}
reps=${2:-3}
[ -n "${ACCRUE_SKIP_DEPS:-}" ] || scripts/install-deps.sh --with-peers
data=${ACCRUE_CMUDICT:-data/cmudict/dict.txt}
[ -f "$data" ] || scripts/fetch-cmudict.sh "$(dirname "$data")"
build=${ACCRUE_BENCH_BUILD_DIR:-build-bench}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCRUE_BUILD_TESTS=OFF \
  -DACCRUE_PEERS=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target accrue-g2p accrue-torch-g2p accrue-bench >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
g2p=("$build/examples/accrue-g2p" --data "$data" --eval validation --eval-limit 1 --quiet)
peer="$build/bench/accrue-torch-g2p"
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
field() { grep -o "\"$1\":[0-9.e+-]*" | head -1 | cut -d: -f2; }  # from a JSON line
word() { awk -v k="$1" '{for (i = 1; i < NF; ++i) if ($i == k) print $(i + 1)}'; }

# 1. The first step, file order.
"${g2p[@]}" --no-shuffle --max-steps 1 --threads 1 --save-init "$work/init.safetensors" \
  --metrics "$work/first.jsonl" >/dev/null
first=$(grep '"step":1,' "$work/first.jsonl")
a_loss=$(echo "$first" | field loss)
a_norm=$(echo "$first" | field grad_norm)
peer_first=$("$peer" "$data" "$work/init.safetensors" 1 1 | head -1)
t_loss=$(echo "$peer_first" | word first_loss)
t_norm=$(echo "$peer_first" | word first_grad_norm)
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; printf "%.1e", d }'; }
loss_rel=$(rel "$t_loss" "$a_loss")
norm_rel=$(rel "$t_norm" "$a_norm")
same=$(awk -v x="$loss_rel" -v y="$norm_rel" 'BEGIN { print (x <= 1e-5 && y <= 1e-5) ? "yes" : "NO" }')

# 2. Training speed, alternating accrue and the peer.
declare -A rates
accrue_run() {  # threads (0: accrue's tuner) -> tokens/s and the last step's loss
  "${g2p[@]}" --init "$work/init.safetensors" --max-steps "$steps" --threads "$1" \
    --metrics "$work/m.jsonl" >/dev/null
  echo "$(grep '"event":"summary"' "$work/m.jsonl" | field tokens_per_second)" \
    "$(grep "\"step\":$steps," "$work/m.jsonl" | field loss)"
}
for _ in $(seq "$reps"); do
  for t in 0 1 "$(nproc)"; do
    read -r rate loss < <(accrue_run "$t")
    rates[accrue-$t]+="$rate "
    accrue_loss=$loss
  done
  for t in 1 "$(nproc)"; do
    line=$("$peer" "$data" "$work/init.safetensors" "$t" "$steps" | tail -1)
    rates[torch-$t]+="$(echo "$line" | word tokens_per_second) "
    torch_loss=$(echo "$line" | word last_loss)
    gemm_flops=$(echo "$line" | word gemm_flops)
    tokens=$(echo "$line" | word tokens)
  done
done
med() { echo "${rates[$1]}" | tr ' ' '\n' | grep . | median | awk '{printf "%.0f\n", $1}'; }

# 3. The same-run GEMM rate (all threads, the faster of accrue's cut and the BLAS library's own).
# accrue-bench --limits measures the limits, prints them on stderr and runs no benchmark.
gemm=$("$build/bench/accrue-bench" --limits 2>&1 >/dev/null |
  sed -n 's/^cpu .*large GEMM \([0-9.]*\) GFLOP\/s$/\1/p')

best_accrue=$(for t in 0 1 "$(nproc)"; do med "accrue-$t"; done | sort -g | tail -1)
best_torch=$(for t in 1 "$(nproc)"; do med "torch-$t"; done | sort -g | tail -1)
floor_rate=$(awk -v g="$gemm" -v f="$gemm_flops" -v n="$tokens" 'BEGIN { printf "%.0f", g * 1e9 / (f / n) }')
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
out=bench/results/g2p-peer-cpu.md
{
  echo "# accrue-g2p against libtorch (bench/g2p-peer.sh $steps $reps)"
  echo
  echo "Machine: $cpu, $(nproc) cores; libtorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '?')."
  echo "The default recipe (4 layers, width 128, 4 heads, 32 x 4, AdamW, warmup + cosine) from the"
  echo "same initial weights (\`--save-init\`), the first $steps windows of epoch 1 (the same samples"
  echo "and micro-batches in both)."
  echo
  echo "**Same model**: first window (file order, before any update): loss accrue $a_loss, libtorch"
  echo "$t_loss (relative difference $loss_rel); gradient norm accrue $a_norm, libtorch $t_norm"
  echo "($norm_rel); within 1e-5: **$same**. Loss after step $steps: accrue $accrue_loss, libtorch $torch_loss."
  echo
  echo "| run | threads | tokens/s (median of $reps) |"
  echo "|---|---|---|"
  echo "| accrue-g2p | 0 (tuned) | $(med accrue-0) |"
  echo "| accrue-g2p | 1 | $(med accrue-1) |"
  echo "| accrue-g2p | $(nproc) | $(med accrue-"$(nproc)") |"
  echo "| libtorch peer | 1 | $(med torch-1) |"
  echo "| libtorch peer | $(nproc) | $(med torch-"$(nproc)") |"
  echo
  echo "accrue's best / libtorch's best = **$(awk -v a="$best_accrue" -v b="$best_torch" 'BEGIN { printf "%.2f", a / b }')** (target: at least 1)."
  echo "GEMM floor: $(awk -v f="$gemm_flops" -v n="$tokens" 'BEGIN { printf "%.2f", f / n / 1e6 }') MFLOP of GEMMs per token (padded micro-batches,"
  echo "forward and backward) at the same-run GEMM rate of $gemm GFLOP/s = $floor_rate tokens/s;"
  echo "accrue's best reaches **$(awk -v a="$best_accrue" -v b="$floor_rate" 'BEGIN { printf "%.2f", a / b }')** of it (its GEMMs run at that share of the"
  echo "machine's GEMM rate at the least; the rest of the step is element-wise work)."
} >"$out"
cat "$out"
