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

}  // namespace accrue::cuda
