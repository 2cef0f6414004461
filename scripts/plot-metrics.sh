#!/usr/bin/env bash
# Draws accrue runs' metrics (--metrics FILE, JSON Lines) against the optimizer step, several
# runs overlaid, each named by its file: the training loss with the evaluations' losses as
# points, the held-out measure (--eval-every and each epoch's end), the gradient norm, the
# learning rate, the loss scale, and throughput (samples/s per window; tokens/s when recorded).
# Reads the JSON with jq and draws with gnuplot (scripts/install-deps.sh --with-plot).
# Usage: scripts/plot-metrics.sh RUN.jsonl [MORE.jsonl ...] -o FILE.png
# Exit 2: a usage mistake; exit 1: a file missing, not JSON Lines, or without step records.
set -euo pipefail

usage() {
  echo "plot-metrics.sh: $1 (usage: plot-metrics.sh RUN.jsonl [MORE.jsonl ...] -o FILE.png)" >&2
  exit 2
}
fail() {
  echo "plot-metrics.sh: $1" >&2
  exit 1
}

inputs=()
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o)
      [ $# -ge 2 ] || usage "-o needs a file name"
      out="$2"
      shift 2
      ;;
    -h | --help)
      sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    -*) usage "unknown option $1" ;;
    *)
      inputs+=("$1")
      shift
      ;;
  esac
done
[ "${#inputs[@]}" -gt 0 ] || usage "no metrics file given"
[ -n "$out" ] || usage "no output given"
case "$out" in *.png) ;; *) usage "-o $out: the output is a .png file" ;; esac
[ -d "$out" ] && usage "-o $out: is a folder"
for file in "${inputs[@]}"; do
  [ -e "$file" ] && [ -e "$out" ] && [ "$file" -ef "$out" ] && usage "-o $out is the input $file"
done
out_dir=$(dirname -- "$out")
[ -d "$out_dir" ] && [ -w "$out_dir" ] || fail "-o $out: cannot write into $out_dir (no such folder, or not writable)"
command -v jq >/dev/null || fail "jq is missing: scripts/install-deps.sh --with-plot"
command -v gnuplot >/dev/null || fail "gnuplot is missing: scripts/install-deps.sh --with-plot"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Per run: steps.tsv (step loss grad_norm lr loss_scale samples/s tokens/s) and evals.tsv
# (step, the evaluation's loss or NaN, its held-out measure or NaN). An epoch's record has no
# step: it is placed at the step before it.
names=()
for i in "${!inputs[@]}"; do
  file="${inputs[$i]}"
  [ -e "$file" ] || fail "$file: no such file"
  [ -f "$file" ] || fail "$file: not a regular file"
  [ -r "$file" ] || fail "$file: cannot read it"
  if ! errors=$(jq -c . "$file" 2>&1 >/dev/null); then
    fail "$file: not JSON Lines (${errors//$'\n'/ })"
  fi
  jq -r 'select(type == "object" and (.step | type) == "number" and has("loss") and (has("event") | not))
         | [.step, .loss, .grad_norm, .lr, .loss_scale,
            (.samples_per_second // "NaN"), (.tokens_per_second // "NaN")]
         | map(if . == null then "NaN" else . end) | @tsv' "$file" >"$work/$i.steps"
  [ -s "$work/$i.steps" ] || fail "$file: no step records (is it the file of --metrics?)"
  jq -rn '
    reduce (inputs | select(type == "object")) as $r ({step: 0, rows: []};
      if ($r | has("event") | not) and ($r | has("step")) then .step = $r.step
      elif $r.event == "eval" or $r.event == "epoch" then
        .rows += [[($r.step // .step),
                   ($r.val_loss // $r.test_loss // "NaN"),
                   ($r.val_accuracy // $r.val_per // $r.test_accuracy // $r.test_per // "NaN")]]
      else . end)
    | .rows[] | @tsv' "$file" >"$work/$i.evals"
  # The run's name as a key label: its file's, without control characters.
  name=$(basename -- "$file" | tr -d '\000-\037')
  names+=("${name%.jsonl}")
done

n=${#inputs[@]}
# The runs' names as a gnuplot array of strings (quotes and backslashes escaped).
name_list=""
for name in "${names[@]}"; do
  name=${name//\\/\\\\}
  name_list+="${name_list:+,}\"${name//\"/\\\"}\""
done
# The last step of any run: every panel's x range, an empty one's too.
last_step=$(cat "$work"/*.steps | awk -F'\t' '$1 > m { m = $1 } END { print int(m * 1.03) + 1 }')
# A panel's gnuplot commands: TITLE, which files (steps or evals), the column that must hold a
# number in some run, and the plot's "for [i=1:n]" body; a panel with no number in any run says
# "not recorded" (an old file without throughput, a run without evaluations).
panel() {
  local title=$1 kind=$2 column=$3 body=$4
  echo "set title \"$title\""
  if cat "$work"/*."$kind" 2>/dev/null | awk -F'\t' -v c="$column" \
       '$c != "NaN" && $c != "" { found = 1 } END { exit !found }'; then
    echo "plot for [i=1:$n] $body"
  else
    echo "set label 1 \"not recorded\" at graph 0.5, 0.5 center"
    echo "set yrange [0:1]"
    echo "plot NaN notitle"
    echo "unset label 1"
    echo "set autoscale y"
  fi
}
# Whether some run recorded tokens/s (a task with sequence lengths): drawn on the right axis.
tokens_recorded() {
  cat "$work"/*.steps | awk -F'\t' '$7 != "NaN" && $7 != "" { found = 1 } END { print found ? "yes" : "no" }'
}
# Drawn into the scratch folder (the user's name never reaches gnuplot), then moved into place.
tmp_out="$work/plot.png"
# gnuplot's warnings (a run without evaluation losses or tokens) are shown only if it fails.
if ! gnuplot 2>"$work/gnuplot.log" <<PLOT
set terminal pngcairo size 1200,900 font ",10" noenhanced
set output "$tmp_out"
set datafile separator "\t"
set datafile missing "NaN"
array name[$n] = [$name_list]
steps(i) = sprintf("%s/%d.steps", "$work", i - 1)
evals(i) = sprintf("%s/%d.evals", "$work", i - 1)
set key top right noenhanced opaque box
set grid
# Room above and below the data: a constant series (a fixed rate, no loss scaling) is drawn
# inside the frame, not on it, and the key covers less.
set offsets graph 0, graph 0, graph 0.25, graph 0.05
set xlabel "optimizer step"
set xrange [0:$last_step]
set format y "%g"
set multiplot layout 3,2 title "accrue metrics"
$(panel "loss (lines: training windows; points: evaluations)" steps 2 \
  "steps(i) using 1:2 with lines lc i title name[i], for [i=1:$n] evals(i) using 1:2 with points pt 7 lc i notitle")
$(panel "evaluation (validation accuracy or PER where recorded, else the test split's)" evals 3 \
  "evals(i) using 1:3 with linespoints pt 7 lc i title name[i]")
$(panel "gradient norm (before clipping)" steps 3 "steps(i) using 1:3 with lines lc i title name[i]")
$(panel "learning rate" steps 4 "steps(i) using 1:4 with lines lc i title name[i]")
set logscale y 2
$(panel "loss scale" steps 5 "steps(i) using 1:5 with lines lc i title name[i]")
unset logscale y
$(if [ "$(tokens_recorded)" = yes ]; then
  echo "set y2tics"
  echo "set ytics nomirror"
  panel "throughput per window (samples/s; tokens/s dashed, right axis)" steps 6 \
    "steps(i) using 1:6 with lines lc i title name[i], for [i=1:$n] steps(i) using 1:7 axes x1y2 with lines dt 2 lc i notitle"
else
  panel "throughput per window (samples/s)" steps 6 "steps(i) using 1:6 with lines lc i title name[i]"
fi)
unset multiplot
PLOT
then
  tail -3 "$work/gnuplot.log" >&2
  fail "gnuplot could not draw $out from ${inputs[*]} (its last lines above)"
fi
# A temporary beside the output, renamed over it: the previous plot survives a failed copy.
cp "$tmp_out" "$out.tmp.$$" && mv -f "$out.tmp.$$" "$out" ||
  { rm -f "$out.tmp.$$"; fail "-o $out: could not write it"; }
echo "plot-metrics.sh: wrote $out (${n} run(s): ${names[*]})"
