#!/usr/bin/env bash
# Draws accrue-memory's CSV (bench/results/memory-cpu.csv): the peak activation memory of a step
# against the effective batch B = b x k, one line per precision and micro-batch b while
# accumulating (fp32 at each b, bf16 at b = 32; the CSV's fp16 and CNN rows are in its table),
# and one per precision for a single batch of B (k = 1), each drawn as it is keyed (lines with
# points). Usage: bench/plot-memory.sh MEMORY.csv OUT.png
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bench/plot-memory.sh MEMORY.csv OUT.png" >&2; exit 2; }
csv=$1 out=$2
[ -f "$csv" ] || { echo "plot-memory.sh: $csv: no such file" >&2; exit 1; }
command -v gnuplot >/dev/null || { echo "plot-memory.sh: no gnuplot (scripts/install-deps.sh --with-plot)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One file per series: "<precision> b=<b>" (k varies) and "<precision> k=1" (b = B).
awk -F, -v dir="$work" 'NR > 1 {
  series = $1 "_b" $2; print $4, $5 / 1048576 > (dir "/" series)
  if ($3 == 1) print $4, $5 / 1048576 > (dir "/" $1 "_k1")
}' "$csv"
device=$(basename "$csv" .csv | sed 's/^memory-//')
# fp32 at every micro-batch, bf16 at one (its lines fall at half fp32's), then the k = 1 lines.
plots=()
for b in $(awk -F, 'NR > 1 && $1 == "fp32" && $3 > 1 { print $2 }' "$csv" | sort -nu); do
  plots+=("\"$work/fp32_b$b\" using 1:2 with linespoints lw 1.5 title \"fp32, accumulating, b = $b\"")
done
[ -f "$work/bf16_b32" ] &&
  plots+=("\"$work/bf16_b32\" using 1:2 with linespoints lw 1.5 dt 3 title \"bf16, accumulating, b = 32\"")
for precision in fp32 bf16; do
  [ -f "$work/${precision}_k1" ] || continue
  color=$([ "$precision" = fp32 ] && echo red || echo black)
  plots+=("\"$work/${precision}_k1\" using 1:2 with linespoints dt 2 lw 2 pt 7 lc \"$color\" title \"$precision, one batch of B (k = 1)\"")
done
joined=$(printf '%s, ' "${plots[@]}")
gnuplot <<PLOT
set terminal pngcairo size 820,500 noenhanced
set output "$out.tmp.png"
set title "MNIST MLP on $device: peak activation memory of a step"
set xlabel "effective batch B = b x k (log scale)"
set ylabel "peak activation MiB (log scale)"
set logscale xy 2
set format y "%g"
set grid
set key top left
set offsets graph 0.02, graph 0.02, graph 0.08, graph 0.08
plot ${joined%, }
PLOT
mv "$out.tmp.png" "$out"
echo "wrote $out"
