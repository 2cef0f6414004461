#!/usr/bin/env bash
# Fetches CMUdict, builds accrue-g2p and trains the default recipe on the best device present:
# a GPT of 4 blocks, width 128, 4 heads (815k parameters), AdamW lr 2e-3 (weight decay 0.01),
# 200 warmup steps then cosine, clip 1.0, micro-batch 32 x 4 accumulation steps over windows
# normalised by their target tokens, 9 epochs; PER and WER on the validation and test splits
# after each epoch; the model saved to g2p.safetensors (then: --init g2p.safetensors --predict
# WORD...). Extra arguments go to accrue-g2p: scripts/train-g2p.sh --epochs 8 ...
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --with-fetch
scripts/fetch-cmudict.sh data/cmudict
build=${ACCRUE_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target accrue-g2p
exec "$build/examples/accrue-g2p" --data data/cmudict/dict.txt --save g2p.safetensors "$@"
