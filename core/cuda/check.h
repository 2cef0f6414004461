// Status checks for CUDA runtime calls: a failure throws BackendError carrying the runtime's own
// error string and the file:line of the call; queries (ACCRUE_CUDA_QUERY) say whether work is done.
// cuBLAS's are in kernels/cuda/cublas_check.h.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "core/host_waits.h"

namespace accrue::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t status, const char* call, const char* file,
                                    int line) {
  throw BackendError(str_cat("[cuda] ", call, " failed: ", cudaGetErrorString(status), " (",
                             cudaGetErrorName(status), ") at ", file, ":", line));
}

// The status of cudaEventQuery or cudaStreamQuery: true when the work is done, false when it is
// not yet (cudaErrorNotReady, which is not a failure: it is cleared from the runtime's last error,
// so that the next launch check does not report it); any other status throws.
inline bool query_done(cudaError_t status, const char* call, const char* file, int line) {
  count_host_wait(HostWait::kPoll);
  if (status == cudaSuccess) return true;
  if (status != cudaErrorNotReady) throw_cuda(status, call, file, line);
  const cudaError_t last = cudaGetLastError();
  if (last != cudaSuccess && last != cudaErrorNotReady) throw_cuda(last, call, file, line);
  return false;
}

}  // namespace accrue::cuda

#define ACCRUE_CUDA_QUERY(call) ::accrue::cuda::query_done((call), #call, __FILE__, __LINE__)

#define ACCRUE_CUDA_CHECK(call)                                              \
  do {                                                                       \
    const cudaError_t accrue_status_ = (call);                               \
    if (accrue_status_ != cudaSuccess) {                                     \
      ::accrue::cuda::throw_cuda(accrue_status_, #call, __FILE__, __LINE__); \
    }                                                                        \
  } while (0)

// A call that makes the host wait for the device (cudaStreamSynchronize, cudaEventSynchronize,
// cudaDeviceSynchronize): checked like any other, and counted (core/host_waits.h).
#define ACCRUE_CUDA_WAIT(call)                                       \
  do {                                                               \
    ::accrue::count_host_wait(::accrue::HostWait::kSynchronization); \
    ACCRUE_CUDA_CHECK(call);                                         \
  } while (0)

// After a kernel launch: reports launch errors (bad configuration, no device) at once.
#define ACCRUE_CUDA_LAUNCH_CHECK() ACCRUE_CUDA_CHECK(cudaGetLastError())
