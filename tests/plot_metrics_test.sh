#!/usr/bin/env bash
# The test of scripts/plot-metrics.sh (CTest runs it): a plot of two generated runs is a PNG of
# the size it draws; a missing file, a malformed line, a file without step records and usage
# mistakes exit non-zero naming the problem, leaving the previous plot as it was. Without gnuplot
# or jq the test fails: scripts/test.sh installs them.
set -uo pipefail
script="$1/scripts/plot-metrics.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() {  # check NAME CONDITION...
  local name="$1"
  shift
  if "$@"; then echo "ok: $name"; else echo "FAILED: $name"; failures=$((failures + 1)); fi
}

# Two runs as the engine writes them: step records, an evaluation, an epoch, a summary.
for run in a b; do
  {
    for step in $(seq 1 40); do
      printf '{"step":%d,"epoch":1,"samples":%d,"loss":%s,"grad_norm":%s,"lr":0.001,' \
        "$step" $((16 * step)) "$(awk -v s="$step" 'BEGIN { print 2 / (s + 1) }')" "1.$step"
      printf '"skipped":false,"loss_scale":%d,"samples_per_second":%d,"tokens_per_second":%d}\n' \
        $([ $run = a ] && echo 1 || echo 65536) $((1000 + step)) $((9000 + step))
      if [ $((step % 10)) -eq 0 ]; then
        printf '{"event":"eval","step":%d,"epoch":1,"val_per":0.%d,"val_loss":0.%d}\n' \
          "$step" $((50 - step)) $((60 - step))
      fi
    done
    echo '{"event":"epoch","epoch":1,"train_loss":0.5,"val_per":0.1,"val_loss":0.2}'
    echo '{"event":"summary","steps":40}'
  } >"$work/run_$run.jsonl"
done

png="$work/plot.png"
out=$("$script" "$work/run_a.jsonl" "$work/run_b.jsonl" -o "$png" 2>&1)
check "two runs drawn (status $?: $out)" test -s "$png"
signature=$(od -An -tx1 -N8 "$png" | tr -d ' \n')
check "PNG signature ($signature)" test "$signature" = 89504e470d0a1a0a
# IHDR: width and height, big-endian, at bytes 16-23.
size=$(od -An -tu1 -j16 -N8 "$png" | awk '{print ($1*2^24+$2*2^16+$3*2^8+$4) "x" ($5*2^24+$6*2^16+$7*2^8+$8)}')
check "1200 x 900 ($size)" test "$size" = 1200x900
check "a plot of some size ($(stat -c %s "$png") bytes)" test "$(stat -c %s "$png")" -gt 20000
drawn=$(md5sum <"$png")

printf '{"step":1,"loss":1}\n{"step":2,\n' >"$work/broken.jsonl"
echo '{"event":"summary","steps":0}' >"$work/nosteps.jsonl"
expect_failure() {  # expect_failure NAME STATUS WORDS -- ARGS...
  local name="$1" status="$2" words="$3"
  shift 4
  local err
  err=$("$script" "$@" 2>&1 >/dev/null)
  local got=$?
  check "$name: exit $got ($err)" test "$got" -eq "$status"
  check "$name: says '$words'" grep -q -- "$words" <<<"$err"
  check "$name: the previous plot kept" test "$(md5sum <"$png")" = "$drawn"
}
expect_failure "missing file" 1 "no such file" -- "$work/none.jsonl" -o "$png"
expect_failure "malformed line" 1 "broken.jsonl: not JSON Lines" -- "$work/broken.jsonl" -o "$png"
expect_failure "no step records" 1 "no step records" -- "$work/nosteps.jsonl" -o "$png"
expect_failure "one good, one missing" 1 "none.jsonl: no such file" -- \
  "$work/run_a.jsonl" "$work/none.jsonl" -o "$png"
expect_failure "no output" 2 "no output given" -- "$work/run_a.jsonl"
expect_failure "no input" 2 "no metrics file given" -- -o "$png"
expect_failure "not a png" 2 "a .png file" -- "$work/run_a.jsonl" -o "$work/plot.jpg"
expect_failure "unknown option" 2 "unknown option --width" -- "$work/run_a.jsonl" --width 3 -o "$png"

cp "$work/run_a.jsonl" "$work/same.png"
expect_failure "output is an input" 2 "is the input" -- "$work/same.png" -o "$work/same.png"
mkdir "$work/folder.png"
expect_failure "output is a folder" 2 "is a folder" -- "$work/run_a.jsonl" -o "$work/folder.png"
expect_failure "output folder missing" 1 "cannot write into" -- "$work/run_a.jsonl" -o "$work/none/x.png"
# A name is a name: quotes in it never reach gnuplot as commands.
(cd "$work" && "$script" run_a.jsonl -o 'x.png"; system("touch INJECTED"); set output "y.png' \
  >/dev/null 2>&1)
check "a quoted output name runs nothing" test ! -e "$work/INJECTED"
check "and is written under its own name" test -s "$work/x.png\"; system(\"touch INJECTED\"); set output \"y.png"

[ "$failures" -eq 0 ] || { echo "$failures check(s) failed"; exit 1; }
