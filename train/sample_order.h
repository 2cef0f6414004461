// The sample order of an epoch: a seeded permutation, a function of (seed, epoch) alone, so
// window w of an epoch holds the same samples however it is split into micro-batches, on every
// rank and after a resume. Read next: engine.h.
#pragma once

#include <cstdint>
#include <vector>

namespace accrue::train {

// File order without shuffling, else a permutation drawn from (seed, epoch) by Fisher-Yates with
// a fixed generator, identical on every platform.
std::vector<int32_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

}  // namespace accrue::train
