// Parameter initialisation with PyTorch's defaults, drawn from one seeded generator so a run is
// reproducible from its --seed.
#pragma once

#include <random>

#include "core/tensor.h"

namespace accrue::nn {

// The generator that layers draw from; seed it once with manual_seed().
std::mt19937_64& generator();
void manual_seed(uint64_t seed);

// U(-bound, bound) in place, from generator().
void uniform_(Tensor& t, double bound);
// PyTorch's Linear default: kaiming_uniform(a = sqrt(5)) on the weight, which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias.
double linear_init_bound(int64_t fan_in);

}  // namespace accrue::nn
