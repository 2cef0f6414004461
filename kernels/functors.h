// The element-wise math of accrue, written once. Each functor is a __host__ __device__ struct:
// the CPU backend runs it in an OpenMP loop (kernels/cpu/), the CUDA backend in one grid-stride
// launcher (kernels/cuda/). Forward functors take x; backward functors take what the forward
// saved and dy. Read next: ops/autograd.h (the reading order of the README).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/geometry.h"
#include "core/half.h"
#include "kernels/op_kinds.h"

#if defined(__CUDACC__)
#define ACCRUE_HD __host__ __device__ __forceinline__
#else
#define ACCRUE_HD inline
#endif

namespace accrue::fn {

// exp and erf for float32 written without branches or library calls, so the CPU's element-wise
// loops vectorise them (libm's expf and erff are scalar calls; GELU spent a fifth of a G2P step
// in them). exp: x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-6 minimax polynomial, 2^n put
// into the exponent bits; relative error ~1e-7, inputs clamped to [-87.3, 88.37] (n stays in
// [-126, 127], so the result is normal and finite: at most e^88.37 = 2.4e38). erf: Abramowitz and
// Stegun 7.1.26, |error| <= 1.5e-7. CUDA's device code and float64 use the library functions.
ACCRUE_HD float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.37f ? 88.37f : x);
  // NaN passes the clamp and reaches the result through r; n, which becomes an integer, takes 0
  // for it instead (converting NaN to an integer is undefined, and its usual INT_MIN then
  // overflowed the shift below).
  const float finite = x == x ? x : 0.0f;
  // Round to nearest by adding and removing 1.5 * 2^23 (|x log2 e| < 2^22): no library call.
  const float n = (finite * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693145751953125f;  // ln2 in two parts: the first exact in float
  r = r - n * 1.428606765330187045e-6f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
ACCRUE_HD float erf_approx(float x) {
  const float a = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly =
      t * (0.254829592f +
           t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  return std::copysign(1.0f - poly * exp_approx(-a * a), x);
}
ACCRUE_HD float erf_of(float x) {
#if defined(__CUDA_ARCH__)
  return erff(x);
#else
  return erf_approx(x);
#endif
}
ACCRUE_HD float exp_of(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return exp_approx(x);
#endif
}
// tanh for float32 in the same way (libm's tanhf is a scalar call): near 0, where
// 1 - 2 / (e^2|x| + 1) would cancel, its odd series to x^13 (|x| < 0.4: truncation below 1e-8
// relative); elsewhere that form with exp_approx; the sign put back. Within 3e-7 relative (5
// float32 ulps). Both are computed and one kept, so the loop has no branch. NaN stays NaN, +-inf
// gives +-1.
ACCRUE_HD float tanh_approx(float x) {
  const float a = std::fabs(x), x2 = x * x;
  float p = 3.5921280365e-3f;  // the odd series' coefficients, highest first
  p = p * x2 - 8.8632355299e-3f;
  p = p * x2 + 2.1869488536e-2f;
  p = p * x2 - 5.3968253968e-2f;
  p = p * x2 + 1.3333333333e-1f;
  p = p * x2 - 3.3333333333e-1f;
  const float series = a + a * x2 * p;
  const float far = 1.0f - 2.0f / (exp_approx(2.0f * a) + 1.0f);
  return std::copysign(a < 0.4f ? series : far, x);
}
ACCRUE_HD float tanh_of(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  return tanh_approx(x);
#endif
}
ACCRUE_HD double tanh_of(double x) {
  return std::tanh(x);
}
ACCRUE_HD double erf_of(double x) {
  return std::erf(x);
}
ACCRUE_HD double exp_of(double x) {
  return std::exp(x);
}

struct ReluBackward;
struct TanhBackward;
struct GeluBackward;

// An activation is a forward functor that names itself, says what its backward reads (the
// input x or the output y) and names its backward functor (saved, dy) -> dx; then one line in
// ACCRUE_UNARY_OPS below registers it on every backend.

// NaN passes through (as in PyTorch), so a NaN hidden behind a ReLU still reaches the loss.
struct Relu {
  static constexpr const char* kName = "relu";
  static constexpr bool kSavesOutput = false;
  using Backward = ReluBackward;
  template <typename T>
  ACCRUE_HD T operator()(T x) const {
    return x < T(0) ? T(0) : x;
  }
};
struct ReluBackward {  // saved: x
  template <typename T>
  ACCRUE_HD T operator()(T x, T dy) const {
    return x > T(0) ? dy : T(0);
  }
};

// Max pooling's rules, shared by both backends. A tap v wins over the best so far when it is
// larger, or when it is the first NaN (a NaN wins and stays, as in PyTorch); no short circuit, so
// the CPU's loops select rather than branch.
template <typename T>
ACCRUE_HD bool pool_beats(T v, T best) {
  return (v > best) | ((v != v) & (best == best));
}
// The argmax max_pool2d_relu keeps for the backward: -1 where the pooled relu(x) is not positive
// (relu's gradient is zero there; relu(x) > 0 exactly where x > 0), else the maximum's index.
template <typename T>
ACCRUE_HD int32_t relu_pool_argmax(int32_t at, T best) {
  return best > T(0) ? at : -1;
}

struct Tanh {
  static constexpr const char* kName = "tanh";
  static constexpr bool kSavesOutput = true;
  using Backward = TanhBackward;
  template <typename T>
  ACCRUE_HD T operator()(T x) const {
    return tanh_of(x);
  }
};
struct TanhBackward {  // saved: y = tanh(x)
  template <typename T>
  ACCRUE_HD T operator()(T y, T dy) const {
    return dy * (T(1) - y * y);
  }
};

// GELU with the exact erf form (PyTorch's default): x * Phi(x).
struct Gelu {
  static constexpr const char* kName = "gelu";
  static constexpr bool kSavesOutput = false;
  using Backward = GeluBackward;
  template <typename T>
  ACCRUE_HD T operator()(T x) const {
    return T(0.5) * x * (T(1) + erf_of(x * T(0.70710678118654752440)));
  }
};
struct GeluBackward {  // saved: x; d/dx = Phi(x) + x * phi(x)
  template <typename T>
  ACCRUE_HD T operator()(T x, T dy) const {
    const T cdf = T(0.5) * (T(1) + erf_of(x * T(0.70710678118654752440)));
    const T pdf = exp_of(T(-0.5) * x * x) * T(0.39894228040143267794);
    return dy * (cdf + x * pdf);
  }
};

struct SigmoidBackward;
// The logistic function 1 / (1 + e^-x), written so that no exp overflows for either sign.
struct Sigmoid {
  static constexpr const char* kName = "sigmoid";
  static constexpr bool kSavesOutput = true;
  using Backward = SigmoidBackward;
  template <typename T>
  ACCRUE_HD T operator()(T x) const {
    if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
    const T e = std::exp(x);
    return e / (T(1) + e);
  }
};
struct SigmoidBackward {  // saved: y = sigmoid(x)
  template <typename T>
  ACCRUE_HD T operator()(T y, T dy) const {
    return dy * y * (T(1) - y);
  }
};

// alpha * x: its own primitive (Backend::scale); its backward is a scale by the same alpha.
struct Scale {
  double alpha;
  template <typename T>
  ACCRUE_HD T operator()(T x) const {
    return T(alpha) * x;
  }
};

struct Add {
  static constexpr const char* kName = "add";
  template <typename T>
  ACCRUE_HD T operator()(T a, T b) const {
    return a + b;
  }
};
struct Sub {
  static constexpr const char* kName = "sub";
  template <typename T>
  ACCRUE_HD T operator()(T a, T b) const {
    return a - b;
  }
};
struct Mul {
  static constexpr const char* kName = "mul";
  template <typename T>
  ACCRUE_HD T operator()(T a, T b) const {
    return a * b;
  }
};
// y + alpha * x: the gradient accumulation `grad += dgrad * scale`.
struct Axpy {
  double alpha;
  template <typename T>
  ACCRUE_HD T operator()(T x, T y) const {
    return y + T(alpha) * x;
  }
};

// out = beta * out + alpha * sum, where beta = 0 ignores out (it may be uninitialised): how row
// reductions (bias gradients) write or accumulate their result.
struct Blend {
  double alpha, beta;
  template <typename T>
  ACCRUE_HD T operator()(T out, T sum) const {
    return beta == 0.0 ? T(alpha) * sum : T(beta) * out + T(alpha) * sum;
  }
};

// The softmax family's element math, given what the row reduction produced.
// log_softmax backward: dx = dy - exp(y) * rowsum(dy).
struct LogSoftmaxGrad {
  template <typename T>
  ACCRUE_HD T operator()(T y, T dy, T rowsum_dy) const {
    return dy - std::exp(y) * rowsum_dy;
  }
};
// Attention's fused softmax over the scores of query i: the scale and the causal mask folded
// into the softmax. Forward, given the row's max m and sum s of exp(scale x - m) over the visible
// keys j <= i: y = exp(scale x - m) / s, and 0 for a key after the query. Backward, given
// dot = sum_k y_k dy_k over the row: dx = scale y (dy - dot) (0 where masked, since y is).
struct CausalSoftmax {
  ACCRUE_HD static bool visible(int64_t key, int64_t query) { return key <= query; }
  // the output from the key's exp(scale x - row_max), where the loop has that already
  template <typename T>
  ACCRUE_HD static T from_exp(T e, T row_sum, bool visible) {
    return visible ? e / row_sum : T(0);
  }
  template <typename T>
  ACCRUE_HD T operator()(T x, T scale, T row_max, T row_sum, bool visible) const {
    return from_exp(std::exp(scale * x - row_max), row_sum, visible);
  }
};
struct CausalSoftmaxGrad {
  template <typename T>
  ACCRUE_HD T operator()(T y, T dy, T dot, T scale) const {
    return scale * y * (dy - dot);
  }
};

// Softmax cross-entropy, one row's loss: lse - logits[label], 0 for kIgnoreLabel, NaN for a label
// outside [0, C) (the CPU checks labels before; a device records the fault beside it).
struct CrossEntropyRowLoss {
  // A label neither ignored nor in [0, C): the fault a device records.
  ACCRUE_HD static bool bad_label(int32_t label, int64_t cols) {
    return label != kIgnoreLabel && (label < 0 || label >= cols);
  }
  template <typename T>
  ACCRUE_HD T operator()(T lse, const T* row, int32_t label, int64_t cols) const {
    if (label == kIgnoreLabel) return T(0);
    return bad_label(label, cols) ? T(NAN) : lse - row[label];
  }
};

// Softmax cross-entropy backward: dlogits = dloss * (softmax - onehot(label)), 0 for a row whose
// label is kIgnoreLabel.
struct CrossEntropyGrad {
  template <typename T>
  ACCRUE_HD T operator()(T prob, bool is_label, T dloss) const {
    return dloss * (prob - (is_label ? T(1) : T(0)));
  }
  template <typename T>
  ACCRUE_HD T operator()(T prob, int64_t column, int32_t label, T dloss) const {
    return label == kIgnoreLabel ? T(0) : (*this)(prob, column == label, dloss);
  }
};

// A permutation of a contiguous tensor's dimensions, as index arithmetic both backends run:
// y = x.permute(dims) (y's dimension i is x's dimension dims[i]), both contiguous. source(j) is
// the offset in x of y's element j: j's digits in y's sizes, each times the stride in x of the
// dimension it came from.
struct PermuteIndex {
  static constexpr int kMaxDims = 8;
  int rank = 0;
  int64_t size[kMaxDims] = {};       // y's sizes
  int64_t in_stride[kMaxDims] = {};  // x's stride (elements) of y's dimension i
  ACCRUE_HD int64_t source(int64_t j) const {
    int64_t offset = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t q = j / size[d];
      offset += (j - q * size[d]) * in_stride[d];
      j = q;
    }
    return offset;
  }
};

// The unfolded patches of the convolution's filter gradient as one GEMM (CUDA, kernels/cuda/
// conv.cu, lowered_filter_gradient): element i of cols [N OH OW, C KH KW] (row: an output pixel
// (n, oh, ow); column: a tap (c, kh, kw), the weight's inner order) is element patch_source(i) of
// x [N, C, H, W], or 0 where that is -1 (the tap falls in the padding). 32-bit: the caller admits
// fewer than 2^31 elements. Written once, so the CPU tests check the index math the GPU runs.
struct LoweredFilterIndex {
  int channels, h, w, kh, kw, oh, ow;
  int stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  // For x [N, channels, h, w], a filter [*, channels, kh, kw] and outputs [N, *, oh, ow].
  static LoweredFilterIndex of(int64_t channels, int64_t h, int64_t w, int64_t kh, int64_t kw,
                               int64_t oh, int64_t ow, const Conv2dGeometry& g) {
    const auto n = [](int64_t v) { return static_cast<int>(v); };
    return {n(channels),    n(h),          n(w),          n(kh),      n(kw),      n(oh),
            n(ow),          n(g.stride_h), n(g.stride_w), n(g.pad_h), n(g.pad_w), n(g.dilation_h),
            n(g.dilation_w)};
  }
  ACCRUE_HD int patch_source(int i) const {
    const int taps = kh * kw, patch = channels * taps, pixels = oh * ow;
    const int row = i / patch, col = i - row * patch;
    const int n = row / pixels, pixel = row - n * pixels;
    const int out_h = pixel / ow, out_w = pixel - out_h * ow;
    const int c = col / taps, tap = col - c * taps;
    const int tap_h = tap / kw, tap_w = tap - tap_h * kw;
    const int ih = out_h * stride_h - pad_h + tap_h * dilation_h;
    const int iw = out_w * stride_w - pad_w + tap_w * dilation_w;
    return ih >= 0 && ih < h && iw >= 0 && iw < w ? ((n * channels + c) * h + ih) * w + iw : -1;
  }
};

// Boundary scalars from the global sum of squares and the non-finite count: out = {norm, coef,
// skip, scale}; steps[0] counts applied updates; scaler = {scale, clean windows} or null. See
// Backend::boundary. Runs on one thread. The loss scale costs nothing here: the overflow check
// is the non-finite count the norm needs anyway, unscaling is folded into coef, and the scale
// moves once per window, never per micro-step.
template <typename T, typename Scaling>
ACCRUE_HD void boundary_scalars(T sum_sq, T nonfinite, double normalize, double max_norm,
                                const Scaling& scaling, T* scaler, T* out, int32_t* steps) {
  const T scale = scaler != nullptr ? scaler[0] : T(1);
  const T unscale = T(normalize) / scale;
  const T norm = unscale * std::sqrt(sum_sq);
  const bool skip = nonfinite > T(0) || !(norm <= T(3.4e38));  // NaN or inf
  T coef = unscale;
  if (max_norm > 0 && norm > T(max_norm)) coef = unscale * T(max_norm) / (norm + T(1e-6));
  out[0] = norm;
  out[1] = coef;
  out[2] = skip ? T(1) : T(0);
  out[3] = scale;
  if (!skip) steps[0] += 1;
  if (scaler != nullptr && scaling.dynamic) {
    if (skip) {
      scaler[0] = scale * T(scaling.backoff);
      scaler[1] = T(0);
    } else if (scaler[1] + T(1) >= T(scaling.growth_interval)) {
      // Never past the largest finite value (as GradScaler): an infinite seed would skip every
      // window from then on.
      const T grown = scale * T(scaling.growth);
      if (grown <= T(3.4e38)) scaler[0] = grown;
      scaler[1] = T(0);
    } else {
      scaler[1] = scaler[1] + T(1);
    }
  }
}

// Normalisation, per element, given the statistics of its group or channel (both backends'
// group_norm and batch_norm): y = (x - mean) rstd weight + bias; and the backward of that with
// the statistics taken from the same values, xhat = (x - mean) rstd, g = dy weight:
// dx = rstd (g - mean(g) - xhat mean(g xhat)), the two means over the normalised set.
struct NormApply {
  template <typename T>
  ACCRUE_HD T operator()(T x, T mean, T rstd, T weight, T bias) const {
    return (x - mean) * rstd * weight + bias;
  }
};
struct NormGrad {
  template <typename T>
  ACCRUE_HD T operator()(T g, T xhat, T rstd, T mean_g, T mean_gx) const {
    return rstd * (g - mean_g - xhat * mean_gx);
  }
};

// The dropout mask: a counter-based hash (splitmix64's finaliser, chained) of the key, the
// sample and the element, whose top 53 bits u stand for the uniform u * 2^-53 in [0, 1); the
// element is kept when that is >= p. The same on both backends and for any micro-batch split.
ACCRUE_HD uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
struct DropoutMask {
  uint64_t seed, step;
  double p, scale;  // scale = 1 / (1 - p)
  // The part of the hash shared by a sample's elements.
  ACCRUE_HD uint64_t row_key(uint64_t sample) const {
    return mix64(mix64(mix64(seed) ^ step) ^ sample);
  }
  // u * 2^-53 >= p, in integers: u >= ceil(p * 2^53). Both scalings by 2^53 are exact and u <
  // 2^53 converts to double exactly, so the two tests agree for every u and p; the integer one
  // has no conversion in it and vectorises (the CPU loop computes the threshold once).
  ACCRUE_HD uint64_t keep_threshold() const {
    return p > 0 ? static_cast<uint64_t>(std::ceil(p * 0x1.0p53)) : 0;
  }
  ACCRUE_HD static bool kept(uint64_t hash, uint64_t threshold) {
    return (hash >> 11) >= threshold;
  }
  // x masked and scaled, given the row's key and the threshold (a loop over a row computes both
  // once). The product is taken either way, so the pick is a select rather than a branch on a
  // coin flip (and a CPU loop of it vectorises).
  template <typename T>
  ACCRUE_HD T apply_in_row(T x, uint64_t row, uint64_t element, uint64_t threshold) const {
    const T scaled = x * T(scale);
    return kept(mix64(row ^ element), threshold) ? scaled : T(0);
  }
  template <typename T>
  ACCRUE_HD T operator()(T x, uint64_t sample, uint64_t element) const {
    return apply_in_row(x, row_key(sample), element, keep_threshold());
  }
};

// The 16-bit working copy of mixed precision: the fused update passes write w[i] = p[i] rounded
// right after updating p[i]. NoWorkingCopy (a null pointer of it) is the one-precision case.
struct NoWorkingCopy {};
template <typename W, typename T>
ACCRUE_HD void write_working(W* w, int64_t i, T p) {
  w[i] = static_cast<W>(p);
}
template <typename T>
ACCRUE_HD void write_working(NoWorkingCopy*, int64_t, T) {}

// One element of Adam / AdamW with PyTorch's semantics: eps outside the square root, bias
// correction, L2 decay into the gradient (Adam) or decoupled decay of the parameter (AdamW).
// coef scales the raw gradient first (normalisation and clipping); the gradient is then zeroed.
struct AdamUpdate {
  double lr, beta1, beta2, eps, weight_decay;
  double step_size;       // lr / (1 - beta1^step)
  double inv_bias2_sqrt;  // 1 / sqrt(1 - beta2^step)
  bool decoupled;
  // step: 1-based count of applied updates, including this one.
  template <typename HP>
  ACCRUE_HD static AdamUpdate at_step(const HP& hp, int32_t step) {
    return {hp.lr,
            hp.beta1,
            hp.beta2,
            hp.eps,
            hp.weight_decay,
            hp.lr / (1.0 - pow(hp.beta1, double(step))),
            1.0 / sqrt(1.0 - pow(hp.beta2, double(step))),
            hp.decoupled};
  }
  // PyTorch's Adam arithmetic, denom = sqrt(v) / sqrt(bias2) + eps and p -= lr / bias1 * m /
  // denom, with the first division done as a multiplication by a precomputed reciprocal (one
  // division fewer per element; the CPU pass is bound by divisions when the arena is in cache).
  template <typename T>
  ACCRUE_HD void operator()(T coef, T& p, T& g, T& m, T& v) const {
    T grad = g * coef;
    g = T(0);
    if (decoupled) {
      p = p * T(1 - lr * weight_decay);
    } else if (weight_decay != 0) {
      grad = grad + T(weight_decay) * p;
    }
    m = T(beta1) * m + T(1 - beta1) * grad;
    v = T(beta2) * v + T(1 - beta2) * grad * grad;
    const T denom = std::sqrt(v) * T(inv_bias2_sqrt) + T(eps);
    p = p - T(step_size) * m / denom;
  }
};

// One element of SGD with momentum, PyTorch's semantics (dampening, nesterov, L2 decay).
struct SgdUpdate {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, first_step;  // the momentum buffer starts as the first gradient
  template <typename HP>
  ACCRUE_HD static SgdUpdate at_step(const HP& hp, int32_t step) {
    return {hp.lr, hp.momentum, hp.dampening, hp.weight_decay, hp.nesterov, step == 1};
  }
  template <typename T>
  ACCRUE_HD void operator()(T coef, T& p, T& g, T& buf) const {
    T grad = g * coef;
    g = T(0);
    if (weight_decay != 0) grad = grad + T(weight_decay) * p;
    if (momentum != 0) {
      buf = first_step ? grad : T(momentum) * buf + T(1 - dampening) * grad;
      grad = nesterov ? grad + T(momentum) * buf : buf;
    }
    p = p - T(lr) * grad;
  }
};

}  // namespace accrue::fn

// The op lists (ACCRUE_UNARY_OPS, ACCRUE_BINARY_OPS) and their enums are in kernels/op_kinds.h.
namespace accrue {

// Calls visitor(F{}) with the functor of op and returns what it returns. On CUDA the visitor is
// a struct with a templated operator() (nvcc takes no device lambdas inside generic lambdas).
#define ACCRUE_VISIT_CASE(functor, value) \
  case Op::value:                         \
    return visitor(fn::functor{});
template <typename V>
decltype(auto) visit(UnaryOp op, V&& visitor) {
  using Op = UnaryOp;
  switch (op) { ACCRUE_UNARY_OPS(ACCRUE_VISIT_CASE) }
  return visitor(fn::Relu{});  // not reached: every enum value has a case
}
template <typename V>
decltype(auto) visit(BinaryOp op, V&& visitor) {
  using Op = BinaryOp;
  switch (op) { ACCRUE_BINARY_OPS(ACCRUE_VISIT_CASE) }
  return visitor(fn::Add{});  // not reached
}
#undef ACCRUE_VISIT_CASE

}  // namespace accrue
