// The tests' view of kernels/cpu/exp.h as the library was built: the kernels are compiled for
// the machine (-march=native) and the tests are not, so a test asks the library rather than
// including the vector code itself.
#pragma once

#include <cstdint>

namespace accrue::cpu {

// Whether the library's float softmax loops take their exponentials through vec::exp_lanes.
bool vector_exp_in_kernels();

// Whether the library's causal softmax computes s x - max with one rounding (a build for FMA).
bool kernels_fuse_scaled_shift();

// y[i] = exp(x[i]) for i < n as those loops compute it: kLanes at a time through vec::exp_lanes
// where vector_exp_in_kernels(), the rest (and everything otherwise) through std::exp.
void exp_floats(const float* x, int64_t n, float* y);

}  // namespace accrue::cpu
