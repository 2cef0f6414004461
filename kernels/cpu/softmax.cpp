// CPU softmax family, one row per iteration: log_softmax and its backward, the fused softmax
// cross-entropy with sum reduction and its backward, attention's causal softmax and its backward.
// Rows are independent, so they run in parallel; the loss sums per-row values in row order
// (deterministic).
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

namespace {

// y = x - max - log(sum exp(x - max)) for one row of length C; returns log-sum-exp.
template <typename T>
T log_softmax_row(const T* x, T* y, int64_t cols) {
  T max = x[0];
  for (int64_t c = 1; c < cols; ++c) max = x[c] > max ? x[c] : max;
  T total = 0;
  for (int64_t c = 0; c < cols; ++c) total += std::exp(x[c] - max);
  const T lse = max + std::log(total);
  for (int64_t c = 0; c < cols; ++c) y[c] = x[c] - lse;
  return lse;
}

}  // namespace

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
      for (int64_t c = 0; c < cols; ++c) p[c] = std::exp(p[c]);
      losses[r] = label[r] == fn::kIgnoreLabel ? T(0) : lse - x[label[r]];
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
  // x, y [B, T, T]: row r is query r % T of its matrix; keys after it are masked
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "causal_softmax", [&] {
    const int64_t t = x.size(2), rows = x.numel() / std::max<int64_t>(t, 1);
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const T s = static_cast<T>(scale);
    for_rows(rows, t, [=](int64_t r) {
      const T* xr = in + r * t;
      const int64_t query = r % t;
      T max = s * xr[0];
      for (int64_t k = 1; k <= query; ++k) max = s * xr[k] > max ? s * xr[k] : max;
      T total = 0;
      for (int64_t k = 0; k <= query; ++k) total += std::exp(s * xr[k] - max);
      for (int64_t k = 0; k < t; ++k) {
        out[r * t + k] =
            fn::CausalSoftmax{}(xr[k], s, max, total, fn::CausalSoftmax::visible(k, query));
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
