// CUDA softmax family over the rows of [N, C] logits: one warp per row, lanes striding over the
// classes, warp shuffles for the row max and sums. The cross-entropy loss sums per-row losses
// with the deterministic sum_all, or, for at most kThreads rows of few classes, in the same
// launch. A label outside [0, C) (the CPU checks labels at the public edge; device-resident
// labels cannot be checked without a copy) makes its row's loss and its row's gradient NaN, so
// the boundary step skips the update, and is recorded as a fault that the next host read
// reports.
#include <cmath>
#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;

template <typename T>
__device__ T warp_max(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T>
__device__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Log-sum-exp of one row, computed by a whole warp.
template <typename T>
__device__ T row_lse(const T* x, int64_t cols, int lane) {
  T m = -INFINITY;
  for (int64_t c = lane; c < cols; c += kWarp) m = max(m, x[c]);
  m = warp_max(m);
  T s = 0;
  for (int64_t c = lane; c < cols; c += kWarp) s += exp(x[c] - m);
  return m + log(warp_sum(s));
}

// x [N, C] -> y [N, C] = log_softmax(x)
template <typename T>
__global__ void log_softmax_kernel(const T* x, T* y, int64_t rows, int64_t cols) {
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const T lse = row_lse(x + r * cols, cols, lane);
  for (int64_t c = lane; c < cols; c += kWarp) y[r * cols + c] = x[r * cols + c] - lse;
}

// y, dy [N, C] -> dx [N, C] = dy - exp(y) * rowsum(dy)
template <typename T>
__global__ void log_softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t rows,
                                            int64_t cols) {
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  T s = 0;
  for (int64_t c = lane; c < cols; c += kWarp) s += dy[r * cols + c];
  s = warp_sum(s);
  for (int64_t c = lane; c < cols; c += kWarp) {
    dx[r * cols + c] = fn::LogSoftmaxGrad{}(y[r * cols + c], dy[r * cols + c], s);
  }
}

// Row r of logits [N, C] by one warp: probs[r, :] = softmax, and the row's loss lse -
// logits[label] (0 for an ignored label), returned to lane 0.
template <typename T>
__device__ T cross_entropy_row(const T* x, const int32_t* labels, T* probs, int64_t r, int64_t cols,
                               int lane, DeviceFault* fault) {
  const T* row = x + r * cols;
  const T lse = row_lse(row, cols, lane);
  for (int64_t c = lane; c < cols; c += kWarp) probs[r * cols + c] = exp(row[c] - lse);
  if (lane != 0) return T(0);
  const int32_t label = labels[r];
  if (fn::CrossEntropyRowLoss::bad_label(label, cols)) record_fault(fault, kLabel, label, r, cols);
  return fn::CrossEntropyRowLoss{}(lse, row, label, cols);
}

// logits [N, C], labels [N] -> probs [N, C] = softmax, row_loss [N] = the rows' losses
template <typename T>
__global__ void cross_entropy_kernel(const T* x, const int32_t* labels, T* probs, T* row_loss,
                                     int64_t rows, int64_t cols, DeviceFault* fault) {
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const T loss = cross_entropy_row(x, labels, probs, r, cols, lane, fault);
  if (lane == 0) row_loss[r] = loss;
}

// logits [N, C], labels [N] -> probs [N, C], loss [] = the sum of the rows' losses, for N <=
// kThreads and N * C small (a micro-batch of a classifier): one block, warp w taking rows w,
// w + kRowsPerBlock, ...; thread t then holds row t's loss, in double, and the block sums them in a
// fixed tree. One launch where the general form takes two (the rows, then sum_all over them).
template <typename T>
__global__ void cross_entropy_one_block(const T* x, const int32_t* labels, T* probs, T* loss,
                                        int64_t rows, int64_t cols, DeviceFault* fault) {
  using BlockReduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  __shared__ double row_loss[kThreads];
  const int lane = threadIdx.x % kWarp;
  for (int64_t r = threadIdx.x / kWarp; r < rows; r += kRowsPerBlock) {
    const T value = cross_entropy_row(x, labels, probs, r, cols, lane, fault);
    if (lane == 0) row_loss[r] = double(value);
  }
  __syncthreads();
  const double mine = threadIdx.x < rows ? row_loss[threadIdx.x] : 0.0;
  const double total = BlockReduce(temp).Sum(mine);
  if (threadIdx.x == 0) loss[0] = T(total);
}

// x [B, Q, T] (Q <= T) -> y: row r is the query at position r % Q + T - Q among the T keys; the
// softmax of scale * x over keys k <= query, 0 after
template <typename T>
__global__ void causal_softmax_kernel(const T* x, T* y, T scale, int64_t rows, int64_t queries,
                                      int64_t t) {
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  const T* row = x + r * t;
  const int64_t query = r % queries + t - queries;
  T m = -INFINITY;
  for (int64_t k = lane; k <= query; k += kWarp) m = max(m, scale * row[k]);
  m = warp_max(m);
  T s = 0;
  for (int64_t k = lane; k <= query; k += kWarp) s += exp(scale * row[k] - m);
  s = warp_sum(s);
  for (int64_t k = lane; k < t; k += kWarp) {
    y[r * t + k] = fn::CausalSoftmax{}(row[k], scale, m, s, fn::CausalSoftmax::visible(k, query));
  }
}

// y, dy [B, T, T] -> dx = scale * y * (dy - rowsum(y * dy))
template <typename T>
__global__ void causal_softmax_backward_kernel(const T* y, const T* dy, T* dx, T scale,
                                               int64_t rows, int64_t t) {
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  T dot = 0;
  for (int64_t k = lane; k < t; k += kWarp) dot += y[r * t + k] * dy[r * t + k];
  dot = warp_sum(dot);
  for (int64_t k = lane; k < t; k += kWarp) {
    dx[r * t + k] = fn::CausalSoftmaxGrad{}(y[r * t + k], dy[r * t + k], dot, scale);
  }
}

int row_blocks(int64_t rows) {
  return static_cast<int>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

void CudaBackend::log_softmax(const Tensor& x, Tensor& y) {
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "log_softmax", [&] {
    if (x.size(0) == 0) return;
    log_softmax_kernel<<<row_blocks(x.size(0)), kThreads, 0, stream_of(x)>>>(
        x.data<T>(), y.data<T>(), x.size(0), x.size(1));
    ACCRUE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  ACCRUE_DISPATCH_FLOATING(y.dtype(), "log_softmax_backward", [&] {
    if (y.size(0) == 0) return;
    log_softmax_backward_kernel<<<row_blocks(y.size(0)), kThreads, 0, stream_of(y)>>>(
        y.data<T>(), dy.data<T>(), dx.data<T>(), y.size(0), y.size(1));
    ACCRUE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::causal_softmax(double scale, const Tensor& x, Tensor& y) {
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "causal_softmax", [&] {
    const int64_t t = x.size(2), rows = t ? x.numel() / t : 0;
    if (rows == 0) return;
    causal_softmax_kernel<<<row_blocks(rows), kThreads, 0, stream_of(x)>>>(
        x.data<T>(), y.data<T>(), static_cast<T>(scale), rows, x.size(1), t);
    ACCRUE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::causal_softmax_backward(double scale, const Tensor& y, const Tensor& dy,
                                          Tensor& dx) {
  ACCRUE_DISPATCH_FLOATING(y.dtype(), "causal_softmax_backward", [&] {
    const int64_t t = y.size(2), rows = t ? y.numel() / t : 0;
    if (rows == 0) return;
    causal_softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, stream_of(y)>>>(
        y.data<T>(), dy.data<T>(), dx.data<T>(), static_cast<T>(scale), rows, t);
    ACCRUE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss,
                                Tensor& probs) {
  ACCRUE_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&] {
    // Per-row losses in the context's row scratch (not an activation), then the deterministic
    // sum. rows >= 1 here: the scratch view needs a non-empty block.
    const int64_t rows = logits.size(0);
    if (rows == 0) {
      fill(loss, 0.0);
      return;
    }
    DeviceContext& ctx = context(logits.device().index);
    // One block while its threads have little to read: a micro-batch over a wide vocabulary
    // (256 rows of 32k classes) would otherwise run on one multiprocessor.
    constexpr int64_t kOneBlockElements = int64_t(1) << 16;
    if (rows <= kThreads && rows * logits.size(1) <= kOneBlockElements) {
      cross_entropy_one_block<<<1, kThreads, 0, ctx.stream>>>(
          logits.data<T>(), labels.data<int32_t>(), probs.data<T>(), loss.data<T>(), rows,
          logits.size(1), ctx.fault);
      ACCRUE_CUDA_LAUNCH_CHECK();
      return;
    }
    T* row_loss = static_cast<T*>(row_scratch(ctx, sizeof(T) * size_t(rows)));
    cross_entropy_kernel<<<row_blocks(rows), kThreads, 0, ctx.stream>>>(
        logits.data<T>(), labels.data<int32_t>(), probs.data<T>(), row_loss, rows, logits.size(1),
        ctx.fault);
    ACCRUE_CUDA_LAUNCH_CHECK();
    T* o = loss.data<T>();
    reduce_sum(row_loss, rows, logits.device(), o);
  });
}

void CudaBackend::cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                         const Tensor& dloss, Tensor& dlogits) {
  // dlogits [N, C] = dloss[0] * (probs - onehot(labels)); rows of ignored labels 0
  ACCRUE_DISPATCH_FLOATING(probs.dtype(), "cross_entropy_backward", [&] {
    const T* p = probs.data<T>();
    const T* g = dloss.data<T>();
    const int32_t* label = labels.data<int32_t>();
    T* out = dlogits.data<T>();
    const int64_t cols = probs.size(1);
    for_each(probs.numel(), stream_of(probs), [=] __device__(int64_t i) {
      const int64_t r = i / cols, c = i - r * cols;
      const int32_t l = label[r];
      const bool usable = (l >= 0 && l < cols) || l == fn::kIgnoreLabel;
      out[i] = usable ? fn::CrossEntropyGrad{}(p[i], c, l, g[0]) : T(NAN);
    });
  });
}

}  // namespace accrue::cuda
