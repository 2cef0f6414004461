// CPU reductions. Full reductions (sum_all, norm_sq) are two-stage: fixed-size chunks summed in
// double, then the chunk results summed in order, so results are bitwise the same for any
// thread count. Row reductions run column blocks in parallel and rows in order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
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

// acc [len] += row [len]
template <typename T>
void add_into(T* acc, const T* row, int64_t len) {
#pragma omp simd
  for (int64_t c = 0; c < len; ++c) acc[c] += row[c];
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

void CpuBackend::sum_rows(const Tensor& x, double alpha, double beta, Tensor& out) {
  // x [N, C] -> out [C] = beta * out + alpha * sum_n x[n, :]
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "sum_rows", [&] {
    const int64_t rows = x.size(0), cols = x.size(1);
    const T* in = x.data<T>();
    T* o = out.data<T>();
    const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
    const fn::Blend blend{alpha, beta};
    for_range(blocks, rows * cols, [=](int64_t blk) {
      const int64_t c0 = blk * kColumnBlock, c1 = std::min(cols, c0 + kColumnBlock);
      T acc[kColumnBlock] = {};
      for (int64_t r = 0; r < rows; ++r) add_into(acc, in + r * cols + c0, c1 - c0);
      for (int64_t c = c0; c < c1; ++c) o[c] = blend(o[c], acc[c - c0]);
    });
  });
}

void CpuBackend::sum_all(const Tensor& x, Tensor& out) {
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "sum", [&] {
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
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "argmax", [&] {
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
