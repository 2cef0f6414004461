// The sample order of an epoch (see sample_order.h).
#include "train/sample_order.h"

#include <numeric>
#include <random>

namespace accrue::train {

std::vector<int32_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
  for (int64_t i = n - 1; i > 0; --i) {
    // Unbiased draw in [0, i] by rejection, independent of the standard library's distributions.
    const uint64_t range = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
    uint64_t r;
    do r = rng();
    while (r >= limit);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(r % range)]);
  }
  return order;
}

}  // namespace accrue::train
