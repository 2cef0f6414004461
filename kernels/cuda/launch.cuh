// Launch helpers shared by the CUDA kernels: a grid-stride for_each over n elements, and the
// element-wise maps that run the __host__ __device__ functors of kernels/functors.h, with a
// 128-bit (float4) path when every pointer is 16-byte aligned and n is a multiple of 4. 16-bit
// elements are loaded into float and rounded once on the store (core/half.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/tensor.h"
#include "core/cuda/check.h"
#include "kernels/cuda/context.h"

namespace accrue::cuda {

constexpr int kThreads = 256;

inline int blocks_for(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 8192)));
}

inline cudaStream_t stream_of(const Tensor& t) {
  return context(t.device().index).stream;
}

// f(i) for every i in [0, n)
template <typename F>
__global__ void for_each_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    f(i);
  }
}

template <typename F>
void for_each(int64_t n, cudaStream_t stream, F f) {
  if (n == 0) return;
  for_each_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, f);
  ACCRUE_CUDA_LAUNCH_CHECK();
}

__host__ __device__ inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// y [n] = op(x) ; float4 loads and stores when possible
template <typename T, typename Op>
void map1(int64_t n, const T* x, T* y, Op op, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (n % 4 == 0 && aligned16(x) && aligned16(y)) {
      const float4* x4 = reinterpret_cast<const float4*>(x);
      float4* y4 = reinterpret_cast<float4*>(y);
      for_each(n / 4, stream, [=] __device__(int64_t i) {
        const float4 v = x4[i];
        y4[i] = make_float4(op(v.x), op(v.y), op(v.z), op(v.w));
      });
      return;
    }
  }
  for_each(n, stream, [=] __device__(int64_t i) { y[i] = store<T>(op(load(x[i]))); });
}

// out [n] = op(a, b) ; float4 loads and stores when possible. out (and b) may be float32 under
// 16-bit a: a gradient added into the float32 arena; the arithmetic is in a's compute type.
template <typename T, typename O, typename Op>
void map2(int64_t n, const T* a, const O* b, O* out, Op op, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<O, float>) {
    if (n % 4 == 0 && aligned16(a) && aligned16(b) && aligned16(out)) {
      const float4* a4 = reinterpret_cast<const float4*>(a);
      const float4* b4 = reinterpret_cast<const float4*>(b);
      float4* o4 = reinterpret_cast<float4*>(out);
      for_each(n / 4, stream, [=] __device__(int64_t i) {
        const float4 u = a4[i], v = b4[i];
        o4[i] = make_float4(op(u.x, v.x), op(u.y, v.y), op(u.z, v.z), op(u.w, v.w));
      });
      return;
    }
  }
  using C = compute_t<T>;
  for_each(n, stream, [=] __device__(int64_t i) {
    out[i] = store<O>(op(load(a[i]), static_cast<C>(load(b[i]))));
  });
}

}  // namespace accrue::cuda
