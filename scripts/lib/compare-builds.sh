# shellcheck shell=bash
# Sourced by scripts/refactor-check.sh and scripts/accuracy-check.sh, which compare a commit's
# accrue-mnist with the current tree's: their arguments, and the two builds.

compare_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# base_and_data NAME ARGS...: the arguments BASE [DATA]. Sets base (BASE's commit) and data (the
# MNIST folder, DATA relative to the caller's folder, default the repository's data/mnist), and
# leaves the shell in the repository's root. A usage error prints one line and exits 2.
base_and_data() {
  local name=$1
  shift
  (( $# >= 1 && $# <= 2 )) || { echo "usage: scripts/$name.sh BASE [DATA]" >&2; exit 2; }
  data=$(realpath -m -- "${2:-$compare_root/data/mnist}")
  cd "$compare_root" || exit 1
  base=$(git rev-parse --verify -q "$1^{commit}" 2>/dev/null) ||
    { echo "$name: $1 is not a commit" >&2; exit 2; }
  [ -f "$data/train-images-idx3-ubyte" ] ||
    { echo "$name: no MNIST in $data (scripts/fetch-mnist.sh $data)" >&2; exit 2; }
}

# two_builds BASE DIR NAME: builds accrue-mnist (and the targets in build_targets, when the
# caller sets it) twice on this machine with the same options, once from BASE (a commit, checked
# out in a git worktree) and once from the current tree, and sets base_build and head_build to the
# two build folders. The worktree and both builds go under DIR; NAME prefixes the messages.
# BASE_BUILD / HEAD_BUILD reuse existing CPU Release build folders instead.
two_builds() {
  local base=$1 dir=$2 name=$3 src
  [ -n "${build_targets+set}" ] || build_targets=()
  local options=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DACCRUE_CUDA=OFF -DACCRUE_BUILD_TESTS=OFF
                 -DACCRUE_BUILD_BENCH=OFF)
  build_mnist() {  # build_mnist SRC BUILD_DIR
    cmake -S "$1" -B "$2" "${options[@]}" >/dev/null
    cmake --build "$2" -j"$(nproc)" --target accrue-mnist "${build_targets[@]}" >/dev/null
  }
  base_build=${BASE_BUILD:-$dir/base-build}
  head_build=${HEAD_BUILD:-$dir/head-build}
  if [ -z "${BASE_BUILD:-}" ]; then
    src="$dir/base-src"
    # a worktree of its own at BASE (a leftover plain folder would answer for the main one)
    if [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null || true)" != "$src" ] ||
       [ "$(git -C "$src" rev-parse HEAD 2>/dev/null || true)" != "$base" ]; then
      rm -rf "$src"
      git worktree prune
      git worktree add --detach "$src" "$base" >/dev/null
    fi
    echo "$name: building $base"
    build_mnist "$src" "$base_build"
  fi
  if [ -z "${HEAD_BUILD:-}" ]; then
    echo "$name: building the current tree"
    build_mnist . "$head_build"
  fi
}
