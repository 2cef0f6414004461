// The base layer's CUDA runtime, for accrue's .cu files: one stream per GPU and the fault record
// through which kernels report bad device-resident indices and labels (read and thrown at the
// next host synchronisation: synchronize(), a copy to the host). Library handles and kernel
// scratch live above, in kernels/cuda/context.h. Compiled only by CUDA builds.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace accrue::cuda {

// What a kernel found wrong with its input. The first fault wins; the host reads it at the next
// synchronisation and throws.
enum FaultOp : int32_t { kNoFault = 0, kGatherIndex = 1, kLabel = 2, kScatterIndex = 3 };
struct DeviceFault {
  int32_t op;        // FaultOp
  int32_t value;     // the bad index or label
  int64_t position;  // its position in the index or label tensor
  int64_t limit;     // the valid range was [0, limit)
};

#if defined(__CUDACC__)
__device__ inline void record_fault(DeviceFault* f, FaultOp op, int32_t value, int64_t position,
                                    int64_t limit) {
  if (atomicCAS(&f->op, int32_t(kNoFault), int32_t(op)) == kNoFault) {
    f->value = value;
    f->position = position;
    f->limit = limit;
  }
}
#endif

struct DeviceRuntime {
  int device = 0;
  // Every kernel, copy and library call of the device runs on this stream, so the caching
  // allocator can hand a freed block to the next request without waiting.
  cudaStream_t stream = nullptr;
  DeviceFault* fault = nullptr;       // device memory, zero when nothing is wrong
  DeviceFault* fault_host = nullptr;  // pinned host copy, read after a synchronisation
};

// Makes `device` current on this thread and returns its runtime, created on first use. Throws
// DeviceError for a device that is not present.
DeviceRuntime& runtime(int device);

// cudaMalloc for buffers held outside the caching allocator (never counted as activations),
// with its out-of-memory policy: give the pool back and retry once, then throw
// OutOfMemoryError naming the sizes. `what` names the buffer in that message.
void* runtime_malloc(int device, size_t nbytes, const char* what);

}  // namespace accrue::cuda
