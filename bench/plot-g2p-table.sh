#!/usr/bin/env bash
# Draws bench/g2p-table.sh's CSV: per configuration, bars of the peak MiB and tokens/s (left
# axis, from 0) and the validation loss after the same samples (right axis, points). The
# configurations' names are set as written (no subscripts, underscores as spaces), the CSV's
# header row is no category.
# Usage: bench/plot-g2p-table.sh TABLE.csv OUT.png [TITLE]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/plot-g2p-table.sh TABLE.csv OUT.png [TITLE]" >&2; exit 2; }
csv=$1 out=$2 title=${3:-G2P GPT under one memory budget: the same samples per configuration}
[ -f "$csv" ] || { echo "plot-g2p-table.sh: $csv: no such file" >&2; exit 1; }
command -v gnuplot >/dev/null ||
  { echo "plot-g2p-table.sh: no gnuplot (scripts/install-deps.sh --with-plot)" >&2; exit 1; }
# The configurations' names with spaces for underscores, for labels that wrap apart.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
awk -F, -v OFS=, 'NR > 1 { gsub("_", " ", $1) } { print }' "$csv" >"$work/table.csv"
gnuplot <<PLOT
set terminal pngcairo size 900,480 noenhanced
set output "$out.tmp.png"
set datafile separator ","
set datafile columnheaders
set title "$title"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.6 border -1
set boxwidth 0.9
set yrange [0:*]
set ylabel "peak MiB; tokens per s / 100"
set y2label "validation loss per token (points)"
set y2range [0:*]
set y2tics
set ytics nomirror
set grid ytics
set key below horizontal
set offsets 0, 0, graph 0.1, 0
set xtics scale 0 rotate by -12
plot "$work/table.csv" using (\$2/1048576):xtic(1) title "peak MiB", \
     "" using (\$6/100) title "tokens/s / 100", \
     "" using 0:7 axes x1y2 with points pt 7 ps 1.5 lc "black" title "validation loss"
PLOT
mv "$out.tmp.png" "$out"
echo "wrote $out"
