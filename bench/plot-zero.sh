#!/usr/bin/env bash
# Draws bench/zero.sh's CSV: the model state per rank against the rank count for each ZeRO stage
# (width 512), and the bytes each rank hands the collectives per window against k (2 ranks).
# Usage: bench/plot-zero.sh ZERO.csv OUT.png
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: bench/plot-zero.sh ZERO.csv OUT.png" >&2; exit 2; }
csv=$1 out=$2
[ -f "$csv" ] || { echo "plot-zero.sh: $csv: no such file" >&2; exit 1; }
command -v gnuplot >/dev/null ||
  { echo "plot-zero.sh: no gnuplot (scripts/install-deps.sh --with-plot)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for c in zero0 zero1 zero2-boundary zero2-micro-step zero3; do
  awk -F, -v c="$c" '$1 == "memory" && $2 == 512 && $5 == c { print $3 "," $9 / 1048576 "," $10 / 1048576 }' "$csv" >"$tmp/mem-$c.csv"
  awk -F, -v c="$c" '$1 == "traffic" && $3 == 2 && $5 == c { w = $14 > 0 ? $14 : 1; print $4 "," ($11 + $12 + $13) / w / 1048576 }' "$csv" >"$tmp/traffic-$c.csv"
done
gnuplot <<PLOT
set terminal pngcairo size 1150,480 noenhanced
set linetype 1 lc rgb "#7b3294" lw 2
set linetype 2 lc rgb "#1b9e77" lw 2
set linetype 3 lc rgb "#0571b0" lw 2
set linetype 4 lc rgb "#e66101" lw 2
set linetype 5 lc rgb "#b2182b" lw 2
set output "$out.tmp.png"
set datafile separator ","
set multiplot layout 1,2 title "ZeRO on the G2P GPT, float32, per rank"
set title "model state after a step (width 512)"
set xlabel "ranks"
set ylabel "MiB"
set xtics (1, 2, 4)
set xrange [0.8:4.2]
set yrange [0:420]
set offsets 0, 0, graph 0.08, 0
set key top right
plot "$tmp/mem-zero0.csv" using 1:2 with linespoints title "ZeRO 0 (data parallel)", \
     "$tmp/mem-zero1.csv" using 1:2 with linespoints title "ZeRO-1", \
     "$tmp/mem-zero2-boundary.csv" using 1:2 with linespoints title "ZeRO-2, boundary", \
     "$tmp/mem-zero2-micro-step.csv" using 1:2 with linespoints title "ZeRO-2, micro-step", \
     "$tmp/mem-zero3.csv" using 1:2 with linespoints title "ZeRO-3"
set title "handed to collectives per window (2 ranks, width 128)"
set xlabel "micro-steps per window k (log scale)"
set logscale x 2
set logscale y 10
set xtics (1, 4, 16)
set xrange [0.8:20]
set yrange [*:*]
set key top left
plot "$tmp/traffic-zero0.csv" using 1:2 with linespoints title "ZeRO 0 (all-reduce)", \
     "$tmp/traffic-zero1.csv" using 1:2 with linespoints lw 3 title "ZeRO-1", \
     "$tmp/traffic-zero2-boundary.csv" using 1:2 with linespoints dt 2 pt 6 ps 2 title "ZeRO-2, boundary (= ZeRO-1)", \
     "$tmp/traffic-zero2-micro-step.csv" using 1:2 with linespoints title "ZeRO-2, micro-step", \
     "$tmp/traffic-zero3.csv" using 1:2 with linespoints title "ZeRO-3"
unset multiplot
PLOT
mv "$out.tmp.png" "$out"
