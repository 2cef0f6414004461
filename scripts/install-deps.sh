#!/usr/bin/env bash
# Installs, with apt-get, whatever accrue's build, tests, benchmarks and MNIST fetch need and the
# machine lacks. Installs nothing when everything is present.
# Usage: scripts/install-deps.sh [--with-fetch] [--with-plot] [--with-peers]
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config libopenblas-openmp-dev libdnnl-dev libgtest-dev
          libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev openmpi-bin libopenmpi-dev)
for extra in "$@"; do
  case "$extra" in
    --with-fetch) packages+=(npm ca-certificates) ;;
    --with-plot) packages+=(gnuplot-nox jq) ;;  # bench plots, scripts/plot-metrics.sh
    --with-peers) packages+=(libtorch-dev) ;;  # the libtorch peers of bench/peers
    *) echo "install-deps.sh: unknown option $extra" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm may come from a non-Debian Node.js install; accept it from PATH.
if command -v npm >/dev/null 2>&1; then
  for i in "${!missing[@]}"; do [ "${missing[$i]}" = npm ] && unset 'missing[i]'; done
fi
[ "${#missing[@]}" -eq 0 ] && exit 0

echo "accrue: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
