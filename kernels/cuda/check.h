// Status checks for CUDA runtime and cuBLAS calls: a failure throws BackendError carrying the
// library's own error string and the file:line of the call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace accrue::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t status, const char* call, const char* file,
                                    int line) {
  throw BackendError(str_cat("[cuda] ", call, " failed: ", cudaGetErrorString(status), " (",
                             cudaGetErrorName(status), ") at ", file, ":", line));
}

[[noreturn]] inline void throw_cublas(cublasStatus_t status, const char* call, const char* file,
                                      int line) {
  throw BackendError(str_cat("[cublas] ", call, " failed: ", cublasGetStatusString(status), " (",
                             cublasGetStatusName(status), ") at ", file, ":", line));
}

}  // namespace accrue::cuda

#define ACCRUE_CUDA_CHECK(call)                                              \
  do {                                                                       \
    const cudaError_t accrue_status_ = (call);                               \
    if (accrue_status_ != cudaSuccess) {                                     \
      ::accrue::cuda::throw_cuda(accrue_status_, #call, __FILE__, __LINE__); \
    }                                                                        \
  } while (0)

#define ACCRUE_CUBLAS_CHECK(call)                                              \
  do {                                                                         \
    const cublasStatus_t accrue_status_ = (call);                              \
    if (accrue_status_ != CUBLAS_STATUS_SUCCESS) {                             \
      ::accrue::cuda::throw_cublas(accrue_status_, #call, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration, no device) at once.
#define ACCRUE_CUDA_LAUNCH_CHECK() ACCRUE_CUDA_CHECK(cudaGetLastError())
