// The per-device CUDA context: one stream, one cuBLAS and one cuBLASLt handle per GPU, created on first use.
// Every kernel, copy and GEMM of a device runs on its stream, so the caching allocator can hand
// a freed block to the next request without waiting: stream order makes the reuse safe.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace accrue::cuda {

struct DeviceContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;
};

// Makes `device` current on this thread and returns its context.
DeviceContext& context(int device);

}  // namespace accrue::cuda
