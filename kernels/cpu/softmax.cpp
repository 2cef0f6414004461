// CPU softmax family, one row per iteration: log_softmax and its backward, the fused softmax
// cross-entropy with sum reduction and its backward, attention's causal softmax and its backward.
// Rows are independent, so they run in parallel; the loss sums per-row values in row order
// (deterministic). In float the exponentials go kLanes at a time through vec::exp_lanes (the bits
// of std::exp, kernels/cpu/exp.h) where the build allows; a row's sum of them still adds them one
// by one in column order, so every result keeps the bits of the scalar loops as GCC compiles them
// when it optimises. One exception was measured: a row holding both a NaN and an infinity (whose
// inf - inf makes a second NaN) gives NaN results, but with the other sign (most likely the sum's
// compiled operand order keeping the other NaN). The row's serial sum is then most of the time.
// The causal softmax keeps each key's exponential in y until the row's sum is known, so it is
// computed once.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/exp.h"
#include "kernels/cpu/exp_probe.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

namespace {

using vec::kLanes;

// Whether T's exponentials run in vectors.
template <typename T>
constexpr bool kVectorExp = std::is_same_v<T, float>&& vec::kVectorExp;

// Whether the build targets FMA, where GCC contracts the causal softmax's s * x - m into one
// rounding when it optimises.
#if defined(__FMA__)
constexpr bool kFusedShift = true;
#else
constexpr bool kFusedShift = false;
#endif

// s x - m as the compiled causal softmax formula rounds it.
template <typename T>
T scaled_shift(T s, T x, T m) {
  return kFusedShift ? std::fma(s, x, -m) : s * x - m;
}

// exp(x[c] - b), or with kScaled exp(scaled_shift(a, x[c], b)), for c in [0, n), handed to
// each(c, value) in column order: kLanes at a time where T's exponentials run in vectors.
template <bool kScaled, typename T, typename Each>
void exps(const T* x, int64_t n, T a, T b, Each each) {
  int64_t c = 0;
  if constexpr (kVectorExp<T>) {
    const vec::Vec<T> va = vec::splat<vec::Vec<T>>(a), minus_b = vec::splat<vec::Vec<T>>(-b);
    for (; c + kLanes <= n; c += kLanes) {
      const vec::Vec<T> v = vec::load<T>(x + c);
      const vec::Vec<T> e = vec::exp_lanes(kScaled ? vec::fma(va, v, minus_b) : v - b);
      for (int64_t j = 0; j < kLanes; ++j) each(c + j, e[j]);
    }
  }
  for (; c < n; ++c) each(c, std::exp(kScaled ? scaled_shift(a, x[c], b) : x[c] - b));
}

// The largest of x[c] (or with kScaled of a x[c], rounded) over c in [0, n), n >= 1: the value
// of the scalar loop m = x[0]; m = x[c] > m ? x[c] : m, found kLanes columns at a time, each lane
// starting from x[0] with the same rule and the lanes then combined by it in order. NaN is
// skipped as there, unless x[0] is one. Only a zero maximum's sign can differ (the loop keeps the
// first zero it meets), and no result below depends on it: x - m and s x - m then differ only
// in the sign of a zero, whose exp is 1 either way, and max + log(sum) is max + a value that is
// +0 or not zero.
template <bool kScaled, typename T>
T row_max(const T* x, int64_t n, T a) {
  const auto value = [=](int64_t c) { return kScaled ? a * x[c] : x[c]; };
  T m = value(0);
  int64_t c = 1;
  if (n >= 2 * kLanes) {
    const vec::Vec<T> va = vec::splat<vec::Vec<T>>(a);
    vec::Vec<T> lanes = vec::splat<vec::Vec<T>>(m);
    for (c = 0; c + kLanes <= n; c += kLanes) {
      const vec::Vec<T> v = kScaled ? va * vec::load<T>(x + c) : vec::load<T>(x + c);
      lanes = vec::greater_else_second(v, lanes);
    }
    for (int64_t j = 0; j < kLanes; ++j) m = lanes[j] > m ? lanes[j] : m;
  }
  for (; c < n; ++c) m = value(c) > m ? value(c) : m;
  return m;
}

// y = x - max - log(sum exp(x - max)) for one row of length C; returns log-sum-exp.
template <typename T>
T log_softmax_row(const T* x, T* y, int64_t cols) {
  const T max = row_max<false>(x, cols, T(1));
  T total = 0;
  exps<false>(x, cols, T(1), max, [&](int64_t, T e) { total += e; });
  const T lse = max + std::log(total);
  for (int64_t c = 0; c < cols; ++c) y[c] = x[c] - lse;
  return lse;
}

}  // namespace

bool vector_exp_in_kernels() {
  return kVectorExp<float>;
}

bool kernels_fuse_scaled_shift() {
  return kFusedShift;
}

void exp_floats(const float* x, int64_t n, float* y) {
  exps<false>(x, n, 1.0f, 0.0f, [=](int64_t i, float e) { y[i] = e; });
}

void CpuBackend::log_softmax(const Tensor& x, Tensor& y) {
  // x [N, C] -> y [N, C]
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "log_softmax", [&] {
    const int64_t rows = x.size(0), cols = x.size(1);
    const T* in = x.data<T>();
    T* out = y.data<T>();
    for_rows(rows, cols, [=](int64_t r) { log_softmax_row(in + r * cols, out + r * cols, cols); });
  });
}

void CpuBackend::log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  // y, dy, dx [N, C]: dx = dy - exp(y) * sum(dy)
  ACCRUE_DISPATCH_FLOATING(y.dtype(), "log_softmax_backward", [&] {
    const int64_t rows = y.size(0), cols = y.size(1);
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    for_rows(rows, cols, [=](int64_t r) {
      const T* yr = py + r * cols;
      const T* gr = pdy + r * cols;
      T* out = pdx + r * cols;
      T total = 0;
      for (int64_t c = 0; c < cols; ++c) total += gr[c];
      for (int64_t c = 0; c < cols; ++c) out[c] = fn::LogSoftmaxGrad{}(yr[c], gr[c], total);
    });
  });
}

void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss,
                               Tensor& probs) {
  // logits [N, C], labels [N] -> loss [1] = sum over labelled rows of (lse_n - logits[n, label_n]),
  // probs [N, C]
  ACCRUE_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&] {
    const int64_t rows = logits.size(0), cols = logits.size(1);
    const int32_t* label = labels.data<int32_t>();
    std::vector<T> row_loss(static_cast<size_t>(rows));
    const T* in = logits.data<T>();
    T* pp = probs.data<T>();
    T* losses = row_loss.data();
    for_rows(rows, cols, [=](int64_t r) {
      const T* x = in + r * cols;
      T* p = pp + r * cols;
      const T lse = log_softmax_row(x, p, cols);
      exps<false>(p, cols, T(1), T(0), [=](int64_t c, T e) { p[c] = e; });
      losses[r] = fn::CrossEntropyRowLoss{}(lse, x, label[r], cols);
    });
    T total = 0;
    for (T v : row_loss) total += v;
    loss.data<T>()[0] = total;
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                        const Tensor& dloss, Tensor& dlogits) {
  // dlogits [N, C] = dloss * (probs - onehot(labels)); rows of ignored labels 0
  ACCRUE_DISPATCH_FLOATING(probs.dtype(), "cross_entropy_backward", [&] {
    const int64_t rows = probs.size(0), cols = probs.size(1);
    const T g = dloss.data<T>()[0];
    const int32_t* label = labels.data<int32_t>();
    const T* p = probs.data<T>();
    T* out = dlogits.data<T>();
    for_rows(rows, cols, [=](int64_t r) {
      for (int64_t c = 0; c < cols; ++c) {
        out[r * cols + c] = fn::CrossEntropyGrad{}(p[r * cols + c], c, label[r], g);
      }
    });
  });
}

void CpuBackend::causal_softmax(double scale, const Tensor& x, Tensor& y) {
  // x, y [B, T, L]: row r is the query at position r % T + L - T among the L keys (the last T
  // positions: a decoder's new tokens after L - T cached ones); keys after it are masked
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "causal_softmax", [&] {
    const int64_t queries = x.size(1), t = x.size(2), rows = x.numel() / std::max<int64_t>(t, 1);
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const T s = static_cast<T>(scale);
    for_rows(rows, t, [=](int64_t r) {
      const T* xr = in + r * t;
      const int64_t query = r % queries + t - queries;
      const T max = row_max<true>(xr, query + 1, s);
      // fn::CausalSoftmax's values from each visible key's exp(s x - max), computed once (s x -
      // max as the compiled functor rounds it: scaled_shift) and kept in y until the sum is known
      T total = 0;
      T* yr = out + r * t;
      exps<true>(xr, query + 1, s, max, [&](int64_t k, T e) {
        yr[k] = e;
        total += e;
      });
      for (int64_t k = 0; k < t; ++k) {
        const bool visible = fn::CausalSoftmax::visible(k, query);
        yr[k] = fn::CausalSoftmax::from_exp(visible ? yr[k] : T(0), total, visible);
      }
    });
  });
}

void CpuBackend::causal_softmax_backward(double scale, const Tensor& y, const Tensor& dy,
                                         Tensor& dx) {
  // y, dy, dx [B, T, T]: dx = scale * y * (dy - sum_k y_k dy_k) per row
  ACCRUE_DISPATCH_FLOATING(y.dtype(), "causal_softmax_backward", [&] {
    const int64_t t = y.size(2), rows = y.numel() / std::max<int64_t>(t, 1);
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const T s = static_cast<T>(scale);
    for_rows(rows, t, [=](int64_t r) {
      T dot = 0;
      for (int64_t k = 0; k < t; ++k) dot += py[r * t + k] * pdy[r * t + k];
      for (int64_t k = 0; k < t; ++k) {
        pdx[r * t + k] = fn::CausalSoftmaxGrad{}(py[r * t + k], pdy[r * t + k], dot, s);
      }
    });
  });
}

}  // namespace accrue::cpu
