// The dispatch seam. Each device backend (CPU in kernels/cpu/, CUDA in kernels/cuda/) implements
// this interface of primitives; backend_for(device) is the one place that picks a backend.
// Primitives only compute: the public ops in core/ops.h validate shapes, dtypes and devices and
// allocate outputs before calling here. All tensors are contiguous; floating tensors of one call
// share a dtype (float32 or float64).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace accrue {

enum class UnaryOp { kRelu, kTanh, kGelu, kScale };
enum class BinaryOp { kAdd, kSub, kMul };

// Hyper-parameters of one fused optimizer pass (see optim/ and kernels/functors.h).
struct AdamParams {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;  // AdamW: decay the parameter directly instead of adding it to the gradient
};
struct SgdParams {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Memory.
  virtual void fill(Tensor& out, double value) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // same device, same bytes
  // Converts between float32 and float64 (and int32) elementwise, same device.
  virtual void cast(const Tensor& src, Tensor& dst) = 0;

  // out [M, ...] = src[index[m], ...] for int32 index [M] (rows of any dtype; data loading).
  virtual void gather_rows(const Tensor& src, const Tensor& index, Tensor& out) = 0;

  // Element-wise: y = op(x) (alpha is the factor of kScale), dx = op'(saved) * dy, where saved is
  // x for relu/gelu/scale and y for tanh; out = a op b.
  virtual void unary(UnaryOp op, const Tensor& x, double alpha, Tensor& y) = 0;
  virtual void unary_backward(UnaryOp op, const Tensor& saved, const Tensor& dy, Tensor& dx) = 0;
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // y += alpha * x: the accumulation primitive.
  virtual void axpy(double alpha, const Tensor& x, Tensor& y) = 0;

  // x [N, C] + b [C] -> y [N, C]
  virtual void bias_add(const Tensor& x, const Tensor& b, Tensor& y) = 0;
  // out [C] = beta * out + alpha * sum over rows of x [N, C]
  virtual void sum_rows(const Tensor& x, double alpha, double beta, Tensor& out) = 0;
  // out [1] = sum of every element of x, in a fixed order (deterministic for any thread count)
  virtual void sum_all(const Tensor& x, Tensor& out) = 0;
  // out [any] = alpha * s[0] everywhere; s is a one-element tensor on the same device
  virtual void expand_scalar(const Tensor& s, double alpha, Tensor& out) = 0;

  // c = alpha * op(a) @ op(b) + beta * c with op = transpose when the flag is set. All 2-D
  // row-major: op(a) is [M, K], op(b) is [K, N], c is [M, N].
  virtual void gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
                    double beta, Tensor& c) = 0;

  // The Linear forward: y [N, out] = x [N, in] @ w [out, in]^T + bias [out] (bias may be
  // undefined). The CPU runs a GEMM then an in-place bias add; CUDA fuses the bias into the GEMM
  // with a cuBLASLt epilogue.
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) = 0;

  // Row-wise over x [N, C]: y = log_softmax(x); dx = dy - exp(y) * rowsum(dy).
  virtual void log_softmax(const Tensor& x, Tensor& y) = 0;
  virtual void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;
  // Fused softmax cross-entropy, sum over rows: logits [N, C], labels int32 [N] ->
  // loss [1] = sum_n -log softmax(logits)[n, label_n], probs [N, C] = softmax(logits).
  virtual void cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss,
                             Tensor& probs) = 0;
  // dlogits [N, C] = dloss[0] * (probs - onehot(labels)).
  virtual void cross_entropy_backward(const Tensor& probs, const Tensor& labels,
                                      const Tensor& dloss, Tensor& dlogits) = 0;
  // x [N, C] -> index int32 [N] of each row's largest value (first on ties).
  virtual void argmax(const Tensor& x, Tensor& index) = 0;
  // Counts rows where labels[n] == index[n]; int32 [N] each -> out int32 [1].
  virtual void count_equal(const Tensor& a, const Tensor& b, Tensor& out) = 0;

  // Optimizer step, once per effective batch, over the flat arenas.
  // out float32/float64 [2] = {sum of g^2, number of non-finite entries}, reduced in a fixed
  // order so the result does not depend on the thread count.
  virtual void norm_sq(const Tensor& g, Tensor& out) = 0;
  // The boundary scalars from norm_sq's output, on the device: out [3] = {norm, coef, skip} with
  // norm = normalize * sqrt(sum g^2) (the pre-clip norm of the normalised gradient),
  // coef = normalize * min(1, max_norm / (norm + 1e-6)) (no clip when max_norm <= 0), and
  // skip = 1 when any entry was non-finite. steps (int32 [1], the optimizer's count of applied
  // updates) is incremented unless the step is skipped; the update passes read it from there.
  virtual void boundary(const Tensor& norm_sq, double normalize, double max_norm, Tensor& out,
                        Tensor& steps) = 0;
  // The fused updates. For every element g' = g * coef, then the update, then g = 0; when skip
  // != 0 the parameters and state are left alone and only g is zeroed. Every scalar that
  // depends on the gradient (coef, skip, the step count for bias correction and SGD's first
  // step) is read on the device, so nothing waits for the host between norm and update.
  virtual void adam_step(const AdamParams& hp, const Tensor& boundary, const Tensor& steps,
                         Tensor& param, Tensor& grad, Tensor& m, Tensor& v) = 0;
  virtual void sgd_step(const SgdParams& hp, const Tensor& boundary, const Tensor& steps,
                        Tensor& param, Tensor& grad, Tensor& momentum) = 0;
};

Backend& backend_for(Device device);

// Backend::gemm's operands in BLAS terms, row-major: a stored matrix's leading dimension is its
// column count whether or not it is used transposed.
struct GemmDims {
  int m, n, k, lda, ldb;
};
inline GemmDims gemm_dims(bool trans_a, const Tensor& a, const Tensor& b, const Tensor& c) {
  return {static_cast<int>(c.size(0)), static_cast<int>(c.size(1)),
          static_cast<int>(trans_a ? a.size(0) : a.size(1)), static_cast<int>(a.size(1)),
          static_cast<int>(b.size(1))};
}

// Declares every primitive above as an override; a backend class holds just this line:
//   class CpuBackend final : public Backend { public: ACCRUE_BACKEND_OVERRIDES };
#define ACCRUE_BACKEND_OVERRIDES                                                                   \
  void fill(Tensor& out, double value) override;                                                   \
  void copy(const Tensor& src, Tensor& dst) override;                                              \
  void cast(const Tensor& src, Tensor& dst) override;                                              \
  void gather_rows(const Tensor& src, const Tensor& index, Tensor& out) override;                  \
  void unary(UnaryOp op, const Tensor& x, double alpha, Tensor& y) override;                       \
  void unary_backward(UnaryOp op, const Tensor& saved, const Tensor& dy, Tensor& dx) override;     \
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;                \
  void axpy(double alpha, const Tensor& x, Tensor& y) override;                                    \
  void bias_add(const Tensor& x, const Tensor& b, Tensor& y) override;                             \
  void sum_rows(const Tensor& x, double alpha, double beta, Tensor& out) override;                 \
  void sum_all(const Tensor& x, Tensor& out) override;                                             \
  void expand_scalar(const Tensor& s, double alpha, Tensor& out) override;                         \
  void gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,            \
            double beta, Tensor& c) override;                                                      \
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) override;   \
  void log_softmax(const Tensor& x, Tensor& y) override;                                           \
  void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;               \
  void cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs)      \
      override;                                                                                    \
  void cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,      \
                              Tensor& dlogits) override;                                           \
  void argmax(const Tensor& x, Tensor& index) override;                                            \
  void count_equal(const Tensor& a, const Tensor& b, Tensor& out) override;                        \
  void norm_sq(const Tensor& g, Tensor& out) override;                                             \
  void boundary(const Tensor& norm_sq, double normalize, double max_norm, Tensor& out,             \
                Tensor& steps) override;                                                           \
  void adam_step(const AdamParams& hp, const Tensor& boundary, const Tensor& steps, Tensor& param, \
                 Tensor& grad, Tensor& m, Tensor& v) override;                                     \
  void sgd_step(const SgdParams& hp, const Tensor& boundary, const Tensor& steps, Tensor& param,   \
                Tensor& grad, Tensor& momentum) override;

}  // namespace accrue
