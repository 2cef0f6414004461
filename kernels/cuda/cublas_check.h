// Status checks for cuBLAS and cuBLASLt calls: a failure throws BackendError carrying the
// library's own error string and the file:line of the call (the runtime's are in
// core/cuda/check.h).
#pragma once

#include <cublas_v2.h>

#include "core/cuda/check.h"

namespace accrue::cuda {

[[noreturn]] inline void throw_cublas(cublasStatus_t status, const char* call, const char* file,
                                      int line) {
  throw BackendError(str_cat("[cublas] ", call, " failed: ", cublasGetStatusString(status), " (",
                             cublasGetStatusName(status), ") at ", file, ":", line));
}

}  // namespace accrue::cuda

#define ACCRUE_CUBLAS_CHECK(call)                                              \
  do {                                                                         \
    const cublasStatus_t accrue_status_ = (call);                              \
    if (accrue_status_ != CUBLAS_STATUS_SUCCESS) {                             \
      ::accrue::cuda::throw_cublas(accrue_status_, #call, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)
