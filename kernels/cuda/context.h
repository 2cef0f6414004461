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

// One cuBLASLt product's shape, types and operand alignments (column-major D [m, n] = op(A)
// op(B), with a bias epilogue when align_bias > 0): the key of the context's algorithm cache.
struct LtKey {
  uint64_t m, n, k;
  int64_t lda, ldb, ldd;
  bool trans_a, trans_b;
  int ab_dtype, d_dtype;
  uint32_t align_a, align_b, align_d, align_bias;  // 0 for align_bias: no bias
  bool operator<(const LtKey& o) const {
    return std::tie(m, n, k, lda, ldb, ldd, trans_a, trans_b, ab_dtype, d_dtype, align_a, align_b,
                    align_d, align_bias) < std::tie(o.m, o.n, o.k, o.lda, o.ldb, o.ldd, o.trans_a,
                                                    o.trans_b, o.ab_dtype, o.d_dtype, o.align_a,
                                                    o.align_b, o.align_d, o.align_bias);
  }
};
// A cuBLASLt plan: the heuristic's algorithm for one key.
struct LtPlan {
  bool found;  // false: no algorithm fits; the caller runs cuBLAS (and a bias add) instead
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
