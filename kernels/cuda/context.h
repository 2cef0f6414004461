// The per-device CUDA context: one stream, one cuBLAS and one cuBLASLt handle per GPU, created on
// first use. Every kernel, copy and GEMM of a device runs on its stream, so the caching allocator
// can hand a freed block to the next request without waiting: stream order makes the reuse safe.
//
// The context also owns the device memory that kernels need for themselves, outside the caching
// allocator, so that it never counts as activation memory: the reductions' partials, cuBLASLt's
// workspace, a row scratch that grows to the largest request, and the fault record through which
// kernels report bad device-resident indices and labels (reported at the next host read).
//
// One host thread drives a device at a time: the scratch buffers are shared by every call on
// the device and kept apart by stream order only, which another thread's launches would break.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

namespace accrue::cuda {

// What a kernel found wrong with its input. The first fault wins; the host reads it at the next
// synchronisation and throws (see check_faults in runtime.cu).
enum FaultOp : int32_t { kNoFault = 0, kGatherIndex = 1, kLabel = 2 };
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

// A cuBLASLt plan: the heuristic's algorithm for one (shape, dtype, alignments, epilogue).
struct LtKey {
  uint64_t rows, in, out;
  int dtype;
  uint32_t align_w, align_x, align_y, align_bias;  // 0 for align_bias: no bias
  bool operator<(const LtKey& o) const {
    return std::tie(rows, in, out, dtype, align_w, align_x, align_y, align_bias) <
           std::tie(o.rows, o.in, o.out, o.dtype, o.align_w, o.align_x, o.align_y, o.align_bias);
  }
};
struct LtPlan {
  bool found;  // false: no algorithm fits; run GEMM + bias add instead
  cublasLtMatmulAlgo_t algo;
};

struct DeviceContext {
  static constexpr size_t kReducePartialBytes = 64 << 10;  // 1056 blocks x 16 bytes fit
  static constexpr size_t kLtWorkspaceBytes = 32 << 20;    // what cuBLASLt suggests for Hopper

  int device = 0;
  cudaStream_t stream = nullptr;
  // The offloaded optimizer's device -> host copies (cuda_copy_to_host_async): a second stream,
  // so the copy engine moves finished gradients while the compute stream runs backward on, and
  // the event that orders each copy after the compute stream's work.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t copy_ready = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;
  void* reduce_partials = nullptr;    // kReducePartialBytes
  void* lt_workspace = nullptr;       // kLtWorkspaceBytes
  DeviceFault* fault = nullptr;       // device memory, zero when nothing is wrong
  DeviceFault* fault_host = nullptr;  // pinned host copy, read after a synchronisation

  std::mutex mutex;             // guards the members below
  void* row_scratch = nullptr;  // row_scratch_bytes, grown on demand
  size_t row_scratch_bytes = 0;
  std::map<LtKey, LtPlan> lt_plans;
};

// Makes `device` current on this thread and returns its context.
DeviceContext& context(int device);

// Device memory of at least nbytes for one kernel's per-row results, valid until the next call
// on the same device (stream order keeps consecutive users apart). Growing it frees the old
// block, which waits for the device.
void* row_scratch(DeviceContext& ctx, size_t nbytes);

}  // namespace accrue::cuda
