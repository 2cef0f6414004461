// The tests' view of vec::copy_row and vec::add_row as the library was built: the kernels are
// compiled for the machine (-march=native) and the tests are not, so a test calls this rather than
// including the vector code itself (as half_lanes_probe.h and exp_probe.h do).
#pragma once

#include <cstdint>

namespace accrue::cpu {

// dst [n] = src [n] through vec::copy_row for elements of 2 (bfloat16), 4 (float) or 8 (double)
// bytes; throws std::invalid_argument for another size.
void copy_row_as_built(const void* src, int64_t n, int64_t element_bytes, void* dst);

// out [n] += src [n] through vec::add_row, in float32 or float64.
void add_row_as_built(const float* src, int64_t n, float* out);
void add_row_as_built(const double* src, int64_t n, double* out);

}  // namespace accrue::cpu
