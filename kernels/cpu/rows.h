// Row loops shared by the CPU kernels that work on one row of a row-major matrix at a time: the
// bias add and ReLU (elementwise.cpp, and the Linear epilogue in gemm.cpp), the running column
// sums of the row reductions and the ReLU mask of the fused Linear + ReLU backward (reduce.cpp).
#pragma once

#include <cstdint>

#include "core/half.h"
#include "kernels/functors.h"

namespace accrue::cpu {

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
