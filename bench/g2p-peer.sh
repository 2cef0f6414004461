#!/usr/bin/env bash
# accrue-g2p against its libtorch peer (bench/peers/torch_g2p.cpp), in one run on this machine:
#  1. the same model: accrue-g2p writes its initial weights (--save-init); the peer loads them
#     and must match accrue's first step (loss and gradient norm, file order, no update) to 1e-5;
#  2. the same training: both train the first STEPS windows of the default recipe from those
#     weights (the same windows, micro-batches and schedule), alternating, median of REPS runs
#     per thread setting, in float32 and in bf16 (accrue's --precision bf16; the peer under CPU
#     autocast in bfloat16); tokens/s counts non-padding input tokens. The peer runs under the
#     OPENBLAS_CORETYPE accrue's programs run with (kernels/cpu/blas_core.h), unless one is set;
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
# The OpenBLAS core accrue's programs choose for this CPU, for the peer's GEMMs too.
"$build/bench/accrue-bench" --benchmark_filter='softmax_ce/cpu/32/10' --benchmark_min_time=0.01 \
  --benchmark_out="$work/core.json" --benchmark_out_format=json >/dev/null 2>&1
core=$(grep -o '"blas_core:cpu": "[A-Za-z0-9]*' "$work/core.json" | sed 's/.*"//')
bf16_library=$(grep -o '"bf16_products:cpu": "[^"]*' "$work/core.json" | sed 's/.*"//')
[ -n "${OPENBLAS_CORETYPE:-}" ] || [ -z "$core" ] || export OPENBLAS_CORETYPE="$core"
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
# The mean window loss of the last 10 steps (one window's loss swings with the spikes of early
# training, which land on other steps in float32 and bf16).
late=$((steps < 10 ? steps : 10))
accrue_run() {  # threads (0: accrue's tuner), precision -> tokens/s and the late loss
  "${g2p[@]}" --init "$work/init.safetensors" --max-steps "$steps" --threads "$1" \
    --precision "$2" --metrics "$work/m.jsonl" >/dev/null
  echo "$(grep '"event":"summary"' "$work/m.jsonl" | field tokens_per_second)" \
    "$(grep '"step":' "$work/m.jsonl" | grep -v '"event"' | grep -o '"loss":[0-9.e+-]*' |
      cut -d: -f2 | tail -n "$late" | awk '{s += $1} END {printf "%.6f", s / NR}')"
}
declare -A last_loss
for _ in $(seq "$reps"); do
  for p in fp32 bf16; do
    for t in 0 1 "$(nproc)"; do
      read -r rate loss < <(accrue_run "$t" "$p")
      rates[accrue-$t-$p]+="$rate "
      last_loss[accrue-$p]=$loss
    done
    for t in 1 "$(nproc)"; do
      line=$("$peer" "$data" "$work/init.safetensors" "$t" "$steps" "$p" | tail -1)
      rates[torch-$t-$p]+="$(echo "$line" | word tokens_per_second) "
      last_loss[torch-$p]=$(echo "$line" | word late_loss)
      gemm_flops=$(echo "$line" | word gemm_flops)
      tokens=$(echo "$line" | word tokens)
    done
  done
done
med() { echo "${rates[$1]}" | tr ' ' '\n' | grep . | median | awk '{printf "%.0f\n", $1}'; }

# 3. The same-run GEMM rate (all threads, the faster of accrue's cut and the BLAS library's own).
# accrue-bench --limits measures the limits, prints them on stderr and runs no benchmark.
gemm=$("$build/bench/accrue-bench" --limits 2>&1 >/dev/null |
  sed -n 's/^cpu .*large GEMM \([0-9.]*\) GFLOP\/s$/\1/p')

best() {  # program precision threads... -> the best median
  local who=$1 p=$2
  shift 2
  for t in "$@"; do med "$who-$t-$p"; done | sort -g | tail -1
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
best_accrue=$(best accrue fp32 0 1 "$(nproc)")
best_torch=$(best torch fp32 1 "$(nproc)")
best_accrue_bf16=$(best accrue bf16 0 1 "$(nproc)")
best_torch_bf16=$(best torch bf16 1 "$(nproc)")
floor_rate=$(awk -v g="$gemm" -v f="$gemm_flops" -v n="$tokens" 'BEGIN { printf "%.0f", g * 1e9 / (f / n) }')
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
out=bench/results/g2p-peer-cpu.md
{
  echo "# accrue-g2p against libtorch (bench/g2p-peer.sh $steps $reps)"
  echo
  echo "Machine: $cpu, $(nproc) cores; libtorch $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '?');"
  echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} for both; accrue's bf16 products on $bf16_library."
  echo "The default recipe (4 layers, width 128, 4 heads, 32 x 4, AdamW, warmup + cosine) from the"
  echo "same initial weights (\`--save-init\`), the first $steps windows of epoch 1 (the same samples"
  echo "and micro-batches in both)."
  echo
  echo "**Same model**: first window (file order, before any update): loss accrue $a_loss, libtorch"
  echo "$t_loss (relative difference $loss_rel); gradient norm accrue $a_norm, libtorch $t_norm"
  echo "($norm_rel); within 1e-5: **$same**."
  echo "Mean window loss of steps $((steps - late + 1))-$steps: accrue ${last_loss[accrue-fp32]} (bf16 ${last_loss[accrue-bf16]}),"
  echo "libtorch ${last_loss[torch-fp32]} (bf16 ${last_loss[torch-bf16]})."
  echo
  echo "| run | threads | float32 tokens/s | bf16 tokens/s | bf16 / float32 |"
  echo "|---|---|---|---|---|"
  row() {  # label program threads
    echo "| $1 | $3 | $(med "$2-$3-fp32") | $(med "$2-$3-bf16") | $(ratio "$(med "$2-$3-bf16")" "$(med "$2-$3-fp32")") |"
  }
  row "accrue-g2p" accrue 0
  row "accrue-g2p" accrue 1
  row "accrue-g2p" accrue "$(nproc)"
  row "libtorch peer" torch 1
  row "libtorch peer" torch "$(nproc)"
  echo
  echo "(Medians of $reps; accrue's threads 0 is its tuner.) accrue's best / libtorch's best:"
  echo "**$(ratio "$best_accrue" "$best_torch")** in float32, **$(ratio "$best_accrue_bf16" "$best_torch_bf16")** in bf16 (target: at least 1);"
  echo "accrue's best bf16 / its best float32: **$(ratio "$best_accrue_bf16" "$best_accrue")**."
  echo "GEMM floor: $(awk -v f="$gemm_flops" -v n="$tokens" 'BEGIN { printf "%.2f", f / n / 1e6 }') MFLOP of GEMMs per token (padded micro-batches,"
  echo "forward and backward) at the same-run GEMM rate of $gemm GFLOP/s = $floor_rate tokens/s;"
  echo "accrue's best reaches **$(awk -v a="$best_accrue" -v b="$floor_rate" 'BEGIN { printf "%.2f", a / b }')** of it (its GEMMs run at that share of the"
  echo "machine's GEMM rate at the least; the rest of the step is element-wise work)."
} >"$out"
cat "$out"
