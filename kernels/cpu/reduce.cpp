// CPU reductions. Full reductions (sum_all, norm_sq) are two-stage: fixed-size chunks summed in
// double, then the chunk results summed in order, so results are bitwise the same for any
// thread count. Row reductions run column blocks in parallel and rows in order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/rows.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

namespace {

constexpr int64_t kChunk = 1 << 14;

// Per-chunk sums in double, reduced in chunk order: deterministic for any thread count.
// body(p, len) returns the double sum over one chunk starting at p.
template <typename T, typename Body>
double chunked(const T* x, int64_t n, Body body) {
  std::vector<double> partial(static_cast<size_t>((n + kChunk - 1) / kChunk), 0.0);
  for_chunks(n, kChunk, [&](int64_t c, int64_t begin, int64_t end) {
    partial[static_cast<size_t>(c)] = body(x + begin, end - begin);
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

template <typename T>
double sum_of(const T* p, int64_t len) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < len; ++i) acc += static_cast<double>(p[i]);
  return acc;
}

template <typename T>
double sum_of_squares(const T* p, int64_t len) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < len; ++i) {
    const double v = static_cast<double>(p[i]);
    acc += v * v;
  }
  return acc;
}

// sum_rows works on blocks of columns, each block's partial sums in registers.
constexpr int64_t kColumnBlock = 256;

template <typename T>
double count_nonfinite(const T* p, int64_t len) {
  double count = 0.0;
  for (int64_t i = 0; i < len; ++i) count += std::isfinite(p[i]) ? 0.0 : 1.0;
  return count;
}

}  // namespace

namespace {

// For each block of columns [c0, c1) of an [rows, cols] matrix of T, in parallel: row(r, c0,
// c1, acc) adds row r's contribution to acc [c1 - c0] (rows in order, in T's compute type), then
// out = blend(out, acc), out being of T or of float32 (with_wide_output). The shared skeleton of
// sum_rows and the fused ReLU + bias backward, so both sum in one order.
template <typename T, typename O, typename Row>
void column_sums(int64_t rows, int64_t cols, fn::Blend blend, O* out, Row row) {
  using C = compute_t<T>;
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  for_range(blocks, rows * cols, [=](int64_t blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(cols, c0 + kColumnBlock);
    C acc[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) row(r, c0, c1, acc);
    if (out != nullptr) {
      for (int64_t c = c0; c < c1; ++c) {
        out[c] = store<O>(blend(static_cast<C>(load(out[c])), acc[c - c0]));
      }
    }
  });
}

}  // namespace

void CpuBackend::sum_rows(const Tensor& x, double alpha, double beta, Tensor& out) {
  // x [N, C] -> out [C] = beta * out + alpha * sum_n x[n, :]
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "sum_rows", [&] {
    const int64_t cols = x.size(1);
    const T* in = x.data<T>();
    with_wide_output<T>(out, "sum_rows", [&](auto* o) {
      column_sums<T>(x.size(0), cols, fn::Blend{alpha, beta}, o,
                     [=](int64_t r, int64_t c0, int64_t c1, compute_t<T>* acc) {
                       add_into(acc, in + r * cols + c0, c1 - c0);
                     });
    });
  });
}

void CpuBackend::relu_bias_backward(const Tensor& y, const Tensor& dy, Tensor& dz, double beta,
                                    Tensor& dbias) {
  // y, dy [N, C] -> dz [N, C] = dy * (y > 0); dbias [C] = beta * dbias + sum_n dz[n, :]
  ACCRUE_DISPATCH_FLOATING_AND_HALF(y.dtype(), "relu_bias_backward", [&] {
    const int64_t cols = y.size(1);
    const T *out = y.data<T>(), *grad = dy.data<T>();
    T* dpre = dz.data<T>();
    const auto run = [&](auto* bias_out) {
      column_sums<T>(y.size(0), cols, fn::Blend{1.0, beta}, bias_out,
                     [=](int64_t r, int64_t c0, int64_t c1, compute_t<T>* acc) {
                       const int64_t at = r * cols + c0;
                       relu_mask_row(out + at, grad + at, dpre + at, c1 - c0);
                       if (bias_out != nullptr) add_into(acc, dpre + at, c1 - c0);
                     });
    };
    if (dbias.defined()) {
      with_wide_output<T>(dbias, "relu_bias_backward", run);
    } else {
      run(static_cast<T*>(nullptr));
    }
  });
}

void CpuBackend::sum_all(const Tensor& x, Tensor& out) {
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "sum", [&] {
    out.data<T>()[0] = static_cast<T>(chunked(x.data<T>(), x.numel(), sum_of<T>));
  });
}

void CpuBackend::norm_sq(const Tensor& g, Tensor& out) {
  // out [2] = {sum of g^2, count of non-finite entries}
  ACCRUE_DISPATCH_FLOATING(g.dtype(), "norm_sq", [&] {
    const T* x = g.data<T>();
    const double sum_sq = chunked(x, g.numel(), sum_of_squares<T>);
    // A non-finite entry makes the sum non-finite; only then are they counted.
    const double nonfinite =
        std::isfinite(sum_sq) ? 0.0 : chunked(x, g.numel(), count_nonfinite<T>);
    out.data<T>()[0] = static_cast<T>(sum_sq);
    out.data<T>()[1] = static_cast<T>(nonfinite);
  });
}

void CpuBackend::argmax(const Tensor& x, Tensor& index) {
  // x [N, C] -> index [N]
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "argmax", [&] {
    const int64_t rows = x.size(0), cols = x.size(1);
    const T* in = x.data<T>();
    int32_t* idx = index.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = in + r * cols;
      idx[r] = static_cast<int32_t>(std::max_element(row, row + cols) - row);
    }
  });
}

void CpuBackend::count_equal(const Tensor& a, const Tensor& b, Tensor& out) {
  const int32_t* pa = a.data<int32_t>();
  const int32_t* pb = b.data<int32_t>();
  int32_t count = 0;
  for (int64_t i = 0; i < a.numel(); ++i) count += pa[i] == pb[i];
  out.data<int32_t>()[0] = count;
}

}  // namespace accrue::cpu
