#!/usr/bin/env bash
# CTest: the manual check scripts (scripts/refactor-check.sh, scripts/accuracy-check.sh,
# bench/ab.sh) reject bad input with exit status 2 and one line naming what was wrong, before they install, build or
# train anything (each case must finish within 10 s). One row per case.
# Usage: bad_input.sh
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
fake_data=$(mktemp -d)
trap 'rm -rf "$fake_data"' EXIT
touch "$fake_data/train-images-idx3-ubyte"  # enough for the scripts' look at DATA
failed=0
check() {  # expected words, then the environment (VAR=value ...) and the command line
  local words=$1
  shift
  local out status
  out=$(cd "$root" && timeout 10 env "$@" 2>&1 </dev/null)
  status=$?
  if [ "$status" -ne 2 ] || [ "$(echo "$out" | wc -l)" -ne 1 ] || ! echo "$out" | grep -qF "$words"; then
    echo "FAIL $*: exit status $status, expected 2 and one line with '$words'; got:"
    echo "$out" | tail -5
    failed=1
  else
    echo "PASS $*: $out"
  fi
}
for script in scripts/refactor-check.sh scripts/accuracy-check.sh; do
  name=$(basename "$script" .sh)
  check "usage: $script BASE [DATA]" "$script"
  check "$name: no-such-commit is not a commit" "$script" no-such-commit
  check "usage: $script BASE [DATA]" "$script" HEAD data extra
  if git -C "$root" rev-parse -q --verify HEAD >/dev/null 2>&1; then
    check "$name: no MNIST in /nonexistent" "$script" HEAD /nonexistent
    check "$name: no MNIST in /nonexistent/mnist" "$script" HEAD /nonexistent/mnist
  else
    echo "SKIP $script HEAD /nonexistent: $root is not a git checkout"
  fi
done
# bench/ab.sh: environment and arguments | the words expected
while IFS='|' read -r args words; do
  read -ra argv <<<"$args"
  check "$words" "${argv[@]}"
done <<'ROWS'
bench/ab.sh|usage: bench/ab.sh A-binary B-binary filter
bench/ab.sh /bin/true /bin/true|usage: bench/ab.sh A-binary B-binary filter
bench/ab.sh /nonexistent /bin/true x|bench/ab.sh: /nonexistent is not an executable
bench/ab.sh /bin/true /nonexistent x|bench/ab.sh: /nonexistent is not an executable
ROUNDS=x bench/ab.sh /bin/true /bin/true x|bench/ab.sh: ROUNDS must be a positive integer
ROUNDS=0 bench/ab.sh /bin/true /bin/true x|bench/ab.sh: ROUNDS must be a positive integer
ROUNDS=07 bench/ab.sh /bin/true /bin/true x|bench/ab.sh: ROUNDS must be a positive integer
THREADS= bench/ab.sh /bin/true /bin/true x|bench/ab.sh: THREADS must be a positive integer
THREADS=-1 bench/ab.sh /bin/true /bin/true x|bench/ab.sh: THREADS must be a positive integer
ROWS
if git -C "$root" rev-parse -q --verify HEAD >/dev/null 2>&1; then
  # ACCURACY_SEEDS | the words expected
  while IFS='|' read -r seeds words; do
    check "$words" ACCURACY_SEEDS="$seeds" scripts/accuracy-check.sh HEAD "$fake_data"
  done <<'ROWS'
1 2 4|ACCURACY_SEEDS must include 1, 2 and 3
   |ACCURACY_SEEDS must include 1, 2 and 3
1 2 3 x|seed 'x' is not a whole number
1 2 3 -1|seed '-1' is not a whole number
01 2 3|seed '01' is not a whole number
1 2 3 99999999999999999999|seed '99999999999999999999' is not a whole number below 10^19
1 2 3 *|seed '*' is not a whole number
1 2 3 2|seed 2 is listed twice
ROWS
fi
exit $failed
