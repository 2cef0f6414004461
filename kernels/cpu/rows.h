// Row loops shared by the CPU kernels that work on one row of a row-major matrix at a time: the
// bias add and ReLU (elementwise.cpp, and the Linear epilogue in gemm.cpp), the running column
// sums of the row reductions and the ReLU mask of the fused Linear + ReLU backward (reduce.cpp),
// and the conversions of 16-bit rows to float32 and back (the 16-bit GEMM's panels, the 16-bit
// convolution's and pooling's float32 sums).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <type_traits>

#include "core/half.h"
#include "kernels/functors.h"

namespace accrue::cpu {

// float16 rows through the CPU's F16C conversions where it has them (every x86-64 CPU since
// 2013): the same round-to-nearest-even results as core/half.h's, eight at a time.
#if defined(__x86_64__)
inline __attribute__((target("avx,f16c"))) void f16c_to_float(const f16* in, float* out,
                                                              int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = load(in[i]);
}
inline __attribute__((target("avx,f16c"))) void f16c_from_float(const float* in, f16* out,
                                                                int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = store<f16>(in[i]);
}
inline bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}
#else
inline void f16c_to_float(const f16*, float*, int64_t) {}
inline void f16c_from_float(const float*, f16*, int64_t) {}
inline bool has_f16c() {
  return false;
}
#endif

// out [n] = in [n] converted to float32
template <typename H>
void row_to_float(const H* in, float* out, int64_t n) {
  if constexpr (std::is_same_v<H, f16>) {
    if (has_f16c()) return f16c_to_float(in, out, n);
  }
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) out[c] = load(in[c]);
}

// out [n] = in [n] rounded to H
template <typename H>
void row_from_float(const float* in, H* out, int64_t n) {
  if constexpr (std::is_same_v<H, f16>) {
    if (has_f16c()) return f16c_from_float(in, out, n);
  }
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) out[c] = store<H>(in[c]);
}

// out [C] = in [C] + bias [C]; out may alias in; the bias may be 16-bit under a float row.
template <typename T, typename B>
void add_row(const T* in, const B* bias, T* out, int64_t cols) {
#pragma omp simd
  for (int64_t c = 0; c < cols; ++c) out[c] = store<T>(load(in[c]) + load(bias[c]));
}

// acc [len] += row [len], acc in the row's compute type
template <typename T>
void add_into(compute_t<T>* acc, const T* row, int64_t len) {
#pragma omp simd
  for (int64_t c = 0; c < len; ++c) acc[c] += load(row[c]);
}

// row [len] = relu(row [len]) in place (NaN kept)
template <typename T>
void relu_row(T* row, int64_t len) {
  const fn::Relu relu;
#pragma omp simd
  for (int64_t c = 0; c < len; ++c) row[c] = store<T>(relu(load(row[c])));
}

// dz [len] = dy where y > 0, else 0 (the ReLU's backward, y being its output)
template <typename T>
void relu_mask_row(const T* y, const T* dy, T* dz, int64_t len) {
  const fn::ReluBackward mask;
#pragma omp simd
  for (int64_t c = 0; c < len; ++c) dz[c] = store<T>(mask(load(y[c]), load(dy[c])));
}

}  // namespace accrue::cpu
