// The sample order of an epoch: a seeded permutation, a function of (seed, epoch) alone, so
// window w of an epoch holds the same samples however it is split into micro-batches, on every
// rank and after a resume. Read next: engine.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace accrue::train {

// File order without shuffling, else a permutation drawn from (seed, epoch) by Fisher-Yates with
// a fixed generator, identical on every platform.
std::vector<int32_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

// `count` of the indices [0, n) (all when count >= n), drawn with `seed` by a partial
// Fisher-Yates with the same generator, in increasing order: an even, seeded sample of a file
// (g2p's --train-limit, MNIST's --validation).
std::vector<size_t> seeded_subset(size_t n, size_t count, uint64_t seed);

}  // namespace accrue::train
