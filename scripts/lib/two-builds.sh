# shellcheck shell=bash
# Sourced by scripts/refactor-check.sh and scripts/accuracy-check.sh: builds accrue-mnist twice on
# this machine with the same options, once from BASE (a commit, checked out in a git worktree) and
# once from the current tree, and sets base_build and head_build to the two build folders.
#
# two_builds BASE DIR NAME: the worktree and both builds go under DIR; NAME prefixes the messages.
# Environment: BASE_BUILD / HEAD_BUILD reuse existing CPU Release build folders instead.
two_builds() {
  local base dir=$2 name=$3 src
  base=$(git rev-parse --verify "$1^{commit}")
  local options=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DACCRUE_CUDA=OFF -DACCRUE_BUILD_TESTS=OFF
                 -DACCRUE_BUILD_BENCH=OFF)
  build_mnist() {  # build_mnist SRC BUILD_DIR
    cmake -S "$1" -B "$2" "${options[@]}" >/dev/null
    cmake --build "$2" -j"$(nproc)" --target accrue-mnist >/dev/null
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
