// Status checks for CUDA runtime calls: a failure throws BackendError carrying the runtime's own
// error string and the file:line of the call. cuBLAS's are in kernels/cuda/cublas_check.h.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace accrue::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t status, const char* call, const char* file,
                                    int line) {
  throw BackendError(str_cat("[cuda] ", call, " failed: ", cudaGetErrorString(status), " (",
                             cudaGetErrorName(status), ") at ", file, ":", line));
}

}  // namespace accrue::cuda

#define ACCRUE_CUDA_CHECK(call)                                              \
  do {                                                                       \
    const cudaError_t accrue_status_ = (call);                               \
    if (accrue_status_ != cudaSuccess) {                                     \
      ::accrue::cuda::throw_cuda(accrue_status_, #call, __FILE__, __LINE__); \
    }                                                                        \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration, no device) at once.
#define ACCRUE_CUDA_LAUNCH_CHECK() ACCRUE_CUDA_CHECK(cudaGetLastError())
