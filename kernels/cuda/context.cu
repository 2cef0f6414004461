// The per-device kernel contexts (see context.h): library handles and kernel scratch, created on
// first use on top of the device's runtime.
#include <algorithm>
#include <memory>
#include <mutex>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/cublas_check.h"

namespace accrue::cuda {

DeviceContext& context(int device) {
  constexpr int kMaxDevices = 16;
  static std::unique_ptr<DeviceContext> contexts[kMaxDevices];
  static std::mutex mutex;
  DeviceRuntime& rt = runtime(device);  // checks the device and makes it current
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = contexts[device];
  if (!slot) {
    auto ctx = std::make_unique<DeviceContext>();
    ctx->device = device;
    ctx->stream = rt.stream;
    ctx->fault = rt.fault;
    ACCRUE_CUBLAS_CHECK(cublasCreate(&ctx->cublas));
    ACCRUE_CUBLAS_CHECK(cublasSetStream(ctx->cublas, ctx->stream));
    // A GEMM with a 16-bit C must sum split-K partials in float32, not in the output type.
    ACCRUE_CUBLAS_CHECK(cublasSetMathMode(
        ctx->cublas, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                               CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    ACCRUE_CUBLAS_CHECK(cublasLtCreate(&ctx->cublas_lt));
    ctx->reduce_partials =
        runtime_malloc(device, DeviceContext::kReducePartialBytes, "reduction partials");
    ctx->lt_workspace =
        runtime_malloc(device, DeviceContext::kLtWorkspaceBytes, "cuBLAS workspace");
    // cuBLAS too works in it (after cublasSetStream, which would reset it): one stream uses it one
    // call at a time, and a CUDA graph's capture finds it ready instead of cuBLAS allocating a
    // workspace of its own per capture.
    ACCRUE_CUBLAS_CHECK(
        cublasSetWorkspace(ctx->cublas, ctx->lt_workspace, DeviceContext::kLtWorkspaceBytes));
    slot = std::move(ctx);
  }
  return *slot;
}

void* row_scratch(DeviceContext& ctx, size_t nbytes) {
  std::lock_guard<std::mutex> lock(ctx.mutex);
  if (nbytes > ctx.row_scratch_bytes) {
    const size_t grown = std::max(nbytes, 2 * ctx.row_scratch_bytes);
    ACCRUE_CUDA_CHECK(cudaSetDevice(ctx.device));
    // The old buffer is kept, not freed: a CUDA graph captured with it writes it at every replay
    // (core/graph.h), and freeing it would wait for the device. Doubling bounds what is kept.
    if (ctx.row_scratch) ctx.retired_scratch.push_back(ctx.row_scratch);
    ctx.row_scratch = nullptr;
    ctx.row_scratch_bytes = 0;
    ctx.row_scratch = runtime_malloc(ctx.device, grown, "row scratch");
    ctx.row_scratch_bytes = grown;
  }
  return ctx.row_scratch;
}

}  // namespace accrue::cuda
