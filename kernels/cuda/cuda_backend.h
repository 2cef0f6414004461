// The CUDA backend: every primitive of kernels/backend.h on one GPU, all on the device's stream
// (context.h). Element-wise math is kernels/functors.h through launch.cuh; GEMM is cuBLAS;
// block reductions use CUB. One family per file: elementwise.cu, index.cu, reduce.cu, gemm.cu,
// softmax.cu, optim.cu.
#pragma once

#include "kernels/backend.h"

namespace accrue::cuda {

class CudaBackend final : public Backend {
 public:
  ACCRUE_BACKEND_OVERRIDES
};

// out [1] = sum of x [n] on the device's stream, deterministic (reduce.cu); for kernels whose
// input is scratch memory rather than a tensor. T is float or double.
template <typename T>
void reduce_sum(const T* x, int64_t n, Device device, T* out);

}  // namespace accrue::cuda
