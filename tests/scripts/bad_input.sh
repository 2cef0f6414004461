#!/usr/bin/env bash
# CTest: the manual check scripts (scripts/refactor-check.sh, scripts/accuracy-check.sh) reject
# bad input with exit status 2 and one line naming what was wrong, before they install, build or
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
if git -C "$root" rev-parse -q --verify HEAD >/dev/null 2>&1; then
  check "ACCURACY_SEEDS must include 1, 2 and 3" \
    ACCURACY_SEEDS="1 2 4" scripts/accuracy-check.sh HEAD "$fake_data"
  check "seed 'x' is not a whole number" \
    ACCURACY_SEEDS="1 2 3 x" scripts/accuracy-check.sh HEAD "$fake_data"
  check "seed '-1' is not a whole number" \
    ACCURACY_SEEDS="1 2 3 -1" scripts/accuracy-check.sh HEAD "$fake_data"
  check "seed '01' is not a whole number" \
    ACCURACY_SEEDS="01 2 3" scripts/accuracy-check.sh HEAD "$fake_data"
  check "seed '99999999999999999999' is not a whole number below 10^19" \
    ACCURACY_SEEDS="1 2 3 99999999999999999999" scripts/accuracy-check.sh HEAD "$fake_data"
  check "seed '*' is not a whole number" \
    ACCURACY_SEEDS="1 2 3 *" scripts/accuracy-check.sh HEAD "$fake_data"
  check "seed 2 is listed twice" ACCURACY_SEEDS="1 2 3 2" scripts/accuracy-check.sh HEAD "$fake_data"
  check "ACCURACY_SEEDS must include 1, 2 and 3" \
    ACCURACY_SEEDS="   " scripts/accuracy-check.sh HEAD "$fake_data"
fi
exit $failed
