// The tests' view of kernels/cpu/vec.h's 16-bit lanes (load_widened, store_rounded) as the library
// was built: the kernels are compiled for the machine (-march=native) and the tests are not, so a
// test asks the library rather than including the vector code itself (as exp_probe.h does).
#pragma once

#include <cstdint>

#include "core/half.h"

namespace accrue::cpu {

// out [n] = in [n] widened to float32, or rounded to 16 bits, 16 lanes at a time as the 16-bit
// direct convolutions convert them; n a multiple of 16.
void widen_lanes(const bf16* in, int64_t n, float* out);
void widen_lanes(const f16* in, int64_t n, float* out);
void round_lanes(const float* in, int64_t n, bf16* out);
void round_lanes(const float* in, int64_t n, f16* out);

}  // namespace accrue::cpu
