// The per-device kernel context: one cuBLAS and one cuBLASLt handle per GPU, created on first use,
// bound to the device's stream from the base runtime (core/cuda/runtime.h). Every kernel, copy
// and GEMM of a device runs on that stream, so the caching allocator can hand a freed block to
// the next request without waiting: stream order makes the reuse safe.
//
// The context also owns the device memory that kernels need for themselves, outside the caching
// allocator, so that it never counts as activation memory: the reductions' partials, cuBLASLt's
// workspace and a row scratch that grows to the largest request. Kernels report bad
// device-resident indices and labels through the runtime's fault record (`fault` below).
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
#include <vector>

#include "core/cuda/runtime.h"

namespace accrue::cuda {

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
  cudaStream_t stream = nullptr;  // the runtime's
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;
  void* reduce_partials = nullptr;  // kReducePartialBytes
  void* lt_workspace = nullptr;     // kLtWorkspaceBytes, cuBLAS's and cuBLASLt's
  DeviceFault* fault = nullptr;     // the runtime's fault record

  std::mutex mutex;             // guards the members below
  void* row_scratch = nullptr;  // row_scratch_bytes, grown on demand
  size_t row_scratch_bytes = 0;
  std::vector<void*> retired_scratch;  // outgrown row scratch, which captured graphs may hold
  std::map<LtKey, LtPlan> lt_plans;
};

// Makes `device` current on this thread and returns its context.
DeviceContext& context(int device);

// Device memory of at least nbytes for one kernel's per-row results, valid until the next call
// on the same device (stream order keeps consecutive users apart). Growing it keeps the old block
// for the process's life (a captured graph may write it).
void* row_scratch(DeviceContext& ctx, size_t nbytes);

}  // namespace accrue::cuda
