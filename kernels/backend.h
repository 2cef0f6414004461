// The dispatch seam. Each device backend (CPU in kernels/cpu/, CUDA in kernels/cuda/) implements
// this interface of primitives; backend_for(device) is the one place that picks a backend.
// Primitives only compute: the public ops in ops/ops.h validate shapes, dtypes and devices and
// allocate outputs before calling here. All tensors are contiguous; floating tensors of one call
// share a dtype (float32 or float64). Read next: kernels/functors.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/geometry.h"
#include "core/tensor.h"
#include "kernels/op_kinds.h"

namespace accrue {

// Every primitive, once: X(name, (parameters), (arguments)). The list expands into the abstract
// interface below, into each backend's overrides (ACCRUE_BACKEND_OVERRIDES), into the tracing
// decorator (kernels/trace.cpp, ACCRUE_TRACE=1) and into the names the backend test table must
// cover (kBackendPrimitives), so a primitive added here without a test row fails
// tests/test_backend.cpp. All 2-D tensors are row-major.
#define ACCRUE_BACKEND_PRIMITIVES(X)                                                               \
  /* Memory. fill: out = value. copy: same device, same bytes. cast: between float32, float64      \
     and int32, element by element, same device. */                                                \
  X(fill, (Tensor & out, double value), (out, value))                                              \
  X(copy, (const Tensor& src, Tensor& dst), (src, dst))                                            \
  X(cast, (const Tensor& src, Tensor& dst), (src, dst))                                            \
  /* out [M, ...] = src[index[m], ...] for int32 index [M] (rows of any dtype; data loading). */   \
  X(gather_rows, (const Tensor& src, const Tensor& index, Tensor& out), (src, index, out))         \
  /* out [V, D] += src [N, D] row n at row index[n], for an int32 index [N]: gather_rows's         \
     backward (an embedding's gradient). Floating, one dtype. Deterministic without atomics: each  \
     output row adds its source rows in increasing n, on every device and thread count. */         \
  X(index_add_rows, (const Tensor& src, const Tensor& index, Tensor& out), (src, index, out))      \
  /* y = x with its dimensions permuted (y's dimension i is x's dims[i]; any dtype, both           \
     contiguous): the head split and merge of attention. */                                        \
  X(permute, (const Tensor& x, const Shape& dims, Tensor& y), (x, dims, y))                        \
  /* Element-wise, for the ops of kernels/functors.h: y = op(x); dx = op'(saved) * dy, saved       \
     being x or y as the functor says; out = a op b; y = alpha * x; y += alpha * x (the            \
     accumulation primitive). */                                                                   \
  X(unary, (UnaryOp op, const Tensor& x, Tensor& y), (op, x, y))                                   \
  X(unary_backward, (UnaryOp op, const Tensor& saved, const Tensor& dy, Tensor& dx),               \
    (op, saved, dy, dx))                                                                           \
  X(binary, (BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out), (op, a, b, out))         \
  X(scale, (double alpha, const Tensor& x, Tensor& y), (alpha, x, y))                              \
  X(axpy, (double alpha, const Tensor& x, Tensor& y), (alpha, x, y))                               \
  /* x [N, C] + b [C] -> y [N, C] (y may alias x). out [C] = beta * out + alpha * sum over rows    \
     of x [N, C]. out [1] = sum of all of x in a fixed order (deterministic for any thread         \
     count). out [any] = alpha * s[0] for a one-element s on the same device. */                   \
  X(bias_add, (const Tensor& x, const Tensor& b, Tensor& y), (x, b, y))                            \
  X(sum_rows, (const Tensor& x, double alpha, double beta, Tensor& out), (x, alpha, beta, out))    \
  /* The elementwise half of a fused linear + ReLU's backward, y [N, C] being the ReLU's output:   \
     dz = dy where y > 0, else 0; dbias [C] = beta * dbias + rowsum(dz) when dbias is defined,     \
     in the same pass (one launch on CUDA). */                                                     \
  X(relu_bias_backward,                                                                            \
    (const Tensor& y, const Tensor& dy, Tensor& dz, double beta, Tensor& dbias),                   \
    (y, dy, dz, beta, dbias))                                                                      \
  X(sum_all, (const Tensor& x, Tensor& out), (x, out))                                             \
  X(expand_scalar, (const Tensor& s, double alpha, Tensor& out), (s, alpha, out))                  \
  /* c = alpha * op(a) @ op(b) + beta * c, op = transpose when the flag is set: op(a) [M, K],      \
     op(b) [K, N], c [M, N]. The Linear forward: y [N, out] = x [N, in] @ w [out, in]^T + bias     \
     [out] (bias may be undefined), then max(y, 0) when relu is set (NaN kept): on the CPU the     \
     bias and ReLU are applied to each GEMM block while it is in cache, on CUDA the bias is a      \
     cuBLASLt epilogue. */                                                                         \
  X(gemm,                                                                                          \
    (bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b, double beta,      \
     Tensor& c),                                                                                   \
    (trans_a, trans_b, alpha, a, b, beta, c))                                                      \
  /* The same for a batch of matrices: a [B, ...], b [B, ...], c [B, M, N], matrix i of c from     \
     matrices i of a and b (bmm and its backward: attention). The CPU runs one gemm per matrix;    \
     CUDA one cublasGemmStridedBatchedEx. */                                                       \
  X(gemm_batched,                                                                                  \
    (bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b, double beta,      \
     Tensor& c),                                                                                   \
    (trans_a, trans_b, alpha, a, b, beta, c))                                                      \
  X(linear_forward, (const Tensor& x, const Tensor& w, const Tensor& bias, bool relu, Tensor& y),  \
    (x, w, bias, relu, y))                                                                         \
  /* Row-wise over x [N, C]: y = log_softmax(x); dx = dy - exp(y) * rowsum(dy). Fused softmax      \
     cross-entropy, sum over rows: logits [N, C], labels int32 [N] -> loss [1] = sum_n -log        \
     softmax(logits)[n, label_n], probs [N, C] = softmax(logits); backward dlogits [N, C] =        \
     dloss[0] * (probs - onehot(labels)). argmax: x [N, C] -> int32 index [N] (first of ties).     \
     count_equal: int32 [N] each -> int32 [1] rows where a == b. */                                \
  X(log_softmax, (const Tensor& x, Tensor& y), (x, y))                                             \
  X(log_softmax_backward, (const Tensor& y, const Tensor& dy, Tensor& dx), (y, dy, dx))            \
  X(cross_entropy, (const Tensor& logits, const Tensor& labels, Tensor& loss, Tensor& probs),      \
    (logits, labels, loss, probs))                                                                 \
  X(cross_entropy_backward,                                                                        \
    (const Tensor& probs, const Tensor& labels, const Tensor& dloss, Tensor& dlogits),             \
    (probs, labels, dloss, dlogits))                                                               \
  /* Attention's scores x [B, T, T] (query, key) -> y = softmax over the keys of scale * x, keys   \
     after the query masked out (y = 0 there); dx = scale * y * (dy - rowsum(y * dy)). */          \
  X(causal_softmax, (double scale, const Tensor& x, Tensor& y), (scale, x, y))                     \
  X(causal_softmax_backward, (double scale, const Tensor& y, const Tensor& dy, Tensor& dx),        \
    (scale, y, dy, dx))                                                                            \
  X(argmax, (const Tensor& x, Tensor& index), (x, index))                                          \
  X(count_equal, (const Tensor& a, const Tensor& b, Tensor& out), (a, b, out))                     \
  /* Convolution, NCHW, groups 1 (kernels/cpu/conv.cpp: im2col + GEMM; CUDA: cuDNN, and one GEMM   \
     over unfolded patches for the float32/float64 filter gradient).                               \
     conv2d_forward: x [N, C, H, W], w [O, C, KH, KW], bias [O] (may be undefined) -> y [N, O,     \
     OH, OW]. conv2d_backward_data: dy [N, O, OH, OW], w -> dx [N, C, H, W].                       \
     conv2d_backward_filter: dw = beta * dw + dy (x) x, dbias = beta * dbias + sum of dy over N,   \
     OH, OW (when defined): beta = 1 accumulates into the gradient arena. */                       \
  X(conv2d_forward,                                                                                \
    (const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dGeometry& g, Tensor& y),    \
    (x, w, bias, g, y))                                                                            \
  X(conv2d_backward_data,                                                                          \
    (const Tensor& dy, const Tensor& w, const Conv2dGeometry& g, Tensor& dx), (dy, w, g, dx))      \
  X(conv2d_backward_filter,                                                                        \
    (const Tensor& dy, const Tensor& x, const Conv2dGeometry& g, double beta, Tensor& dw,          \
     Tensor& dbias),                                                                               \
    (dy, x, g, beta, dw, dbias))                                                                   \
  /* Pooling, x [N, C, H, W] -> y [N, C, OH, OW]; padding counts in the average (PyTorch's         \
     default) and never wins a maximum. max_pool2d also writes argmax (int32, like y: the flat     \
     index in the input plane of the first maximum); its backward adds dy at argmax into dx,       \
     which it zeroes first, skipping argmax -1. With relu it pools relu(x) (fn::Relu per tap) and  \
     writes argmax -1 where the maximum is not positive (relu's gradient is zero there).           \
     avg_pool2d_backward spreads dy / region size over each region. */                             \
  X(max_pool2d, (const Tensor& x, const Pool2dGeometry& g, bool relu, Tensor& y, Tensor& argmax),  \
    (x, g, relu, y, argmax))                                                                       \
  X(max_pool2d_backward, (const Tensor& dy, const Tensor& argmax, Tensor& dx), (dy, argmax, dx))   \
  X(avg_pool2d, (const Tensor& x, const Pool2dGeometry& g, Tensor& y), (x, g, y))                  \
  X(avg_pool2d_backward, (const Tensor& dy, const Pool2dGeometry& g, Tensor& dx), (dy, g, dx))     \
  /* Normalisation of x [N, C, S] (S = H * W). group_norm: statistics per sample and group of C /  \
     groups channels -> mean, rstd [N, groups] (rstd = 1 / sqrt(biased var + eps)); y = (x -       \
     mean) rstd weight[c] + bias[c] (weight, bias [C], or undefined: 1 and 0). batch_norm:         \
     statistics per channel over N and S -> mean, rstd [C], and, when momentum >= 0, running_mean  \
     = (1 - momentum) running_mean + momentum mean, running_var likewise with the unbiased         \
     variance; with use_running (evaluation) it normalises with the running statistics instead     \
     (mean, rstd are then those). The backward passes take the saved mean and rstd: dx, and        \
     dweight = beta * dweight + sum dy xhat, dbias = beta * dbias + sum dy (each when defined);    \
     batch_norm_backward with use_running treats the statistics as constants. */                   \
  X(group_norm,                                                                                    \
    (const Tensor& x, int64_t groups, double eps, const Tensor& weight, const Tensor& bias,        \
     Tensor& y, Tensor& mean, Tensor& rstd),                                                       \
    (x, groups, eps, weight, bias, y, mean, rstd))                                                 \
  X(group_norm_backward,                                                                           \
    (const Tensor& dy, const Tensor& x, int64_t groups, const Tensor& mean, const Tensor& rstd,    \
     const Tensor& weight, Tensor& dx, double beta, Tensor& dweight, Tensor& dbias),               \
    (dy, x, groups, mean, rstd, weight, dx, beta, dweight, dbias))                                 \
  /* group_norm_relu_max_pool2d: max_pool2d_relu(group_norm(x)) for x [N, C, H, W], the same       \
     y, argmax, mean and rstd bits as the two primitives (the normalised activation need not       \
     reach memory); its backward takes the pooled dy and the argmax and writes what                \
     max_pool2d_backward then group_norm_backward would. */                                        \
  X(group_norm_relu_max_pool2d,                                                                    \
    (const Tensor& x, int64_t groups, double eps, const Tensor& weight, const Tensor& bias,        \
     const Pool2dGeometry& g, Tensor& y, Tensor& argmax, Tensor& mean, Tensor& rstd),              \
    (x, groups, eps, weight, bias, g, y, argmax, mean, rstd))                                      \
  X(group_norm_relu_max_pool2d_backward,                                                           \
    (const Tensor& dy, const Tensor& argmax, const Tensor& x, int64_t groups, const Tensor& mean,  \
     const Tensor& rstd, const Tensor& weight, const Pool2dGeometry& g, Tensor& dx, double beta,   \
     Tensor& dweight, Tensor& dbias),                                                              \
    (dy, argmax, x, groups, mean, rstd, weight, g, dx, beta, dweight, dbias))                      \
  X(batch_norm,                                                                                    \
    (const Tensor& x, double eps, double momentum, bool use_running, const Tensor& weight,         \
     const Tensor& bias, Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor& mean,       \
     Tensor& rstd),                                                                                \
    (x, eps, momentum, use_running, weight, bias, running_mean, running_var, y, mean, rstd))       \
  X(batch_norm_backward,                                                                           \
    (const Tensor& dy, const Tensor& x, bool use_running, const Tensor& mean, const Tensor& rstd,  \
     const Tensor& weight, Tensor& dx, double beta, Tensor& dweight, Tensor& dbias),               \
    (dy, x, use_running, mean, rstd, weight, dx, beta, dweight, dbias))                            \
  /* Dropout of x [N, ...]: y = x / (1 - p) where the element is kept, else 0, the mask drawn      \
     from the key, the row's sample index (int32 [N]) and the element's index in its row. The      \
     backward is the same call on dy. */                                                           \
  X(dropout, (const Tensor& x, const DropoutKey& key, const Tensor& samples, Tensor& y),           \
    (x, key, samples, y))                                                                          \
  /* The optimizer step, once per effective batch, over the flat arenas. norm_sq: out [2] =        \
     {sum of g^2, number of non-finite entries}, in a fixed order. boundary: out [4] = {norm,      \
     coef, skip, scale}; scale = scaler[0], the loss scale the window's backward was seeded with   \
     (1 when scaler is undefined); norm = normalize / scale * sqrt(sum g^2) (the pre-clip norm of  \
     the normalised, unscaled gradient); coef = normalize / scale * min(1, max_norm / (norm +      \
     1e-6)) (no clip when max_norm <= 0); skip = 1 when any entry was non-finite; steps (int32     \
     [1], applied updates) += 1 unless skipped; scaler [2] = {scale, clean windows in a row} is    \
     updated as LossScaling says. The fused updates: g' = g * coef, the update, g = 0, and the     \
     16-bit working copy (undefined: none) = the new parameter rounded; with skip != 0 only g =    \
     0. coef, skip, the scale and the step count stay on the device: nothing waits for the host.   \
   */                                                                                              \
  X(norm_sq, (const Tensor& g, Tensor& out), (g, out))                                             \
  X(boundary,                                                                                      \
    (const Tensor& norm_sq, double normalize, double max_norm, const LossScaling& scaling,         \
     Tensor& scaler, Tensor& out, Tensor& steps),                                                  \
    (norm_sq, normalize, max_norm, scaling, scaler, out, steps))                                   \
  X(adam_step,                                                                                     \
    (const AdamArgs& hp, const Tensor& boundary, const Tensor& steps, Tensor& param, Tensor& grad, \
     Tensor& m, Tensor& v, Tensor& working),                                                       \
    (hp, boundary, steps, param, grad, m, v, working))                                             \
  X(sgd_step,                                                                                      \
    (const SgdArgs& hp, const Tensor& boundary, const Tensor& steps, Tensor& param, Tensor& grad,  \
     Tensor& momentum, Tensor& working),                                                           \
    (hp, boundary, steps, param, grad, momentum, working))

#define ACCRUE_BACKEND_PURE_VIRTUAL(name, params, args) virtual void name params = 0;
#define ACCRUE_BACKEND_OVERRIDE(name, params, args) void name params override;
#define ACCRUE_BACKEND_NAME(name, params, args) #name,

class Backend {
 public:
  virtual ~Backend() = default;
  ACCRUE_BACKEND_PRIMITIVES(ACCRUE_BACKEND_PURE_VIRTUAL)
};

// Declares every primitive as an override; a backend class holds just this line:
//   class CpuBackend final : public Backend { public: ACCRUE_BACKEND_OVERRIDES };
#define ACCRUE_BACKEND_OVERRIDES ACCRUE_BACKEND_PRIMITIVES(ACCRUE_BACKEND_OVERRIDE)

// The name of every primitive, in interface order.
inline constexpr const char* kBackendPrimitives[] = {
    ACCRUE_BACKEND_PRIMITIVES(ACCRUE_BACKEND_NAME)};

Backend& backend_for(Device device);

// Creates the device's library handles and kernel scratch now (on a GPU: cuBLAS and cuBLASLt, the
// reduction partials, the GEMM workspace; on the CPU nothing), instead of at the first kernel that
// needs them. The engine calls it while setting up, so a run's first window times training.
void prepare_backend(Device device);

// Why the convolution primitives cannot run on `device`, in words; "" when they can (the CPU,
// and a GPU of a build with cuDNN). Those primitives throw DeviceError with these words; the
// tests skip on them.
std::string conv_unavailable_reason(Device device);

// Matrix i of a batch [B, rows, cols], as a [rows, cols] view.
inline Tensor batch_matrix(const Tensor& t, int64_t i) {
  return t.narrow(i, 1).view({t.size(1), t.size(2)});
}

// Backend::gemm's operands in BLAS terms, row-major: a stored matrix's leading dimension is its
// column count whether or not it is used transposed.
struct GemmDims {
  int m, n, k, lda, ldb;
};
// Leading dimensions are at least 1, as BLAS requires even when a matrix has no columns (K = 0:
// c = beta c).
inline GemmDims gemm_dims(bool trans_a, const Tensor& a, const Tensor& b, const Tensor& c) {
  return {static_cast<int>(c.size(0)), static_cast<int>(c.size(1)),
          static_cast<int>(trans_a ? a.size(0) : a.size(1)),
          static_cast<int>(std::max<int64_t>(1, a.size(1))),
          static_cast<int>(std::max<int64_t>(1, b.size(1)))};
}

}  // namespace accrue
