#!/usr/bin/env bash
# Draws bench/pipeline.sh's CSV: the bubble (each stage's idle share of the window against k, with
# the theory (P-1)/(k+P-1)) and stage 0's peak activations under GPipe and 1F1B.
# Usage: bench/plot-pipeline.sh PIPELINE.csv OUT.png CPU-NAME
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: bench/plot-pipeline.sh PIPELINE.csv OUT.png CPU-NAME" >&2; exit 2; }
csv=$1 out=$2 cpu=$3
[ -f "$csv" ] || { echo "plot-pipeline.sh: $csv: no such file" >&2; exit 1; }
command -v gnuplot >/dev/null ||
  { echo "plot-pipeline.sh: no gnuplot (scripts/install-deps.sh --with-plot)" >&2; exit 1; }
gnuplot <<PLOT
set terminal pngcairo size 900,450 noenhanced
set output "$out.tmp.png"
set datafile separator ","
set multiplot layout 1,2 title "G2P GPT in two pipeline stages ($cpu)"
set xlabel "micro-batches per window k (log scale)"
set logscale x 2
set xtics (2, 4, 8, 16)
set xrange [1.7:19]
set ylabel "idle share of the window"
set key top right
# Room above the highest point: none sits on the frame.
set offsets 0, 0, graph 0.08, 0
set title "the bubble"
plot "< grep gpipe $csv" using 1:5 with linespoints title "GPipe stage 0", \
     "< grep gpipe $csv" using 1:6 with linespoints title "GPipe stage 1", \
     "< grep 1f1b $csv" using 1:5 with linespoints title "1F1B stage 0", \
     "< grep 1f1b $csv" using 1:6 with linespoints title "1F1B stage 1", \
     "< grep gpipe $csv" using 1:7 with lines dt 2 lw 2 title "(P-1)/(k+P-1)"
set title "peak activations, stage 0"
set ylabel "MiB"
set key top left
plot "< grep gpipe $csv" using 1:(\$8/1048576) with linespoints title "GPipe (k in flight)", \
     "< grep 1f1b $csv" using 1:(\$8/1048576) with linespoints title "1F1B (P in flight)"
unset multiplot
PLOT
mv "$out.tmp.png" "$out"
echo "wrote $out"
