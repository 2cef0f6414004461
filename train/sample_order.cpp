// The sample order of an epoch (see sample_order.h).
#include "train/sample_order.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace accrue::train {

namespace {

// An unbiased draw in [0, range) by rejection, independent of the standard library's
// distributions (whose draws differ between libraries).
uint64_t below(std::mt19937_64& rng, uint64_t range) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
  uint64_t r;
  do r = rng();
  while (r >= limit);
  return r % range;
}

}  // namespace

std::vector<int32_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
  for (int64_t i = n - 1; i > 0; --i) {
    std::swap(order[static_cast<size_t>(i)],
              order[static_cast<size_t>(below(rng, static_cast<uint64_t>(i) + 1))]);
  }
  return order;
}

std::vector<size_t> seeded_subset(size_t n, size_t count, uint64_t seed) {
  std::vector<size_t> index(n);
  std::iota(index.begin(), index.end(), size_t{0});
  std::mt19937_64 rng(seed);
  count = std::min(count, n);
  for (size_t i = 0; i < count; ++i) std::swap(index[i], index[i + below(rng, n - i)]);
  index.resize(count);
  std::sort(index.begin(), index.end());
  return index;
}

}  // namespace accrue::train
