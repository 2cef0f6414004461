// Seeded initialisation (see init.h).
#include "nn/init.h"
#include "kernels/factories.h"

#include <cmath>

namespace accrue::nn {

std::mt19937_64& generator() {
  static std::mt19937_64 rng(0);
  return rng;
}

void manual_seed(uint64_t seed) {
  generator().seed(seed);
}

void uniform_(Tensor& t, double bound) {
  t.copy_(uniform(t.shape(), -bound, bound, generator(), t.dtype(), t.device()));
}

double linear_init_bound(int64_t fan_in) {
  return fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
}

}  // namespace accrue::nn
