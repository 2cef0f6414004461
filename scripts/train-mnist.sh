#!/usr/bin/env bash
# Fetches MNIST, builds accrue-mnist and trains the default recipe on the best device present
# (784-512-256-128-10 ReLU MLP, Adam lr 1e-3, micro-batch 32 x 4 accumulation steps, clip 1.0,
# 5 epochs). Extra arguments go to accrue-mnist: scripts/train-mnist.sh --epochs 20 ...
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --with-fetch
scripts/fetch-mnist.sh data/mnist
build=${ACCRUE_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target accrue-mnist
exec "$build/examples/accrue-mnist" --data data/mnist "$@"
