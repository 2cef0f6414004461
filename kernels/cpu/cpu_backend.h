// The CPU backend: the reference implementation of every primitive in kernels/backend.h.
// Element-wise math comes from kernels/functors.h through the loops in parallel.h; GEMM is
// OpenBLAS. Each family has its own file: elementwise.cpp, reduce.cpp, gemm.cpp, softmax.cpp,
// optim.cpp, conv.cpp, pool.cpp, norm.cpp, dropout.cpp.
#pragma once

#include "kernels/backend.h"

namespace accrue::cpu {

class CpuBackend final : public Backend {
 public:
  ACCRUE_BACKEND_OVERRIDES
};

// t in its compute dtype (compute_dtype, core/dtype.h): t itself where it already is (or is
// undefined), else a copy cast by `be`. How a kernel without a 16-bit form runs on widened
// operands.
Tensor in_compute_dtype(Backend& be, const Tensor& t);

}  // namespace accrue::cpu
