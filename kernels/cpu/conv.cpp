// CPU convolution, NCHW, as im2col + GEMM: a sample's patches are unfolded into
// cols [C KH KW, OH OW] and multiplied by the weight viewed as [O, C KH KW], which writes the
// sample's output [O, OH OW] in NCHW order directly. The samples are shared out over the team,
// each sample one single-threaded BLAS call (the filter gradient: a few samples side by side per
// call, see kFilterLoweringBytes) with its unfolded patches in the thread's own scratch
// (225 KiB for the MNIST CNN's conv2: it stays in L2 between the unfolding and the product); the
// scratch comes from the caching allocator, so it counts as activation memory. The bias is
// written first and the GEMM adds onto it (beta = 1), saving a pass over the output.
//
// Deterministic and independent of the thread count: each sample's output is one call in a
// fixed order, and the filter gradient's sum over samples is cut into chunks fixed by the shape,
// each a partial sum in its own buffer, added in chunk order at the end.
//
// Measured (bench/kernels.cpp, conv2d_*): one call per sample on one thread runs conv2 at about
// twice the rate of each sample's product threaded by the GEMM cut (16-column blocks of a
// [64, 288] x [288, 196] product). For a one-channel conv1, rows of multiply-adds over the
// unfolded patches (each output row read and written once per tap) run slower than a K = 9 BLAS
// call in all three passes, so the direct kernels below keep a block's sums in registers.
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/conv_lowering.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm_cut.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec.h"
#include "kernels/dispatch.h"

namespace accrue::cpu {

namespace {

using namespace lowering;

ConvShape conv_shape(const Tensor& x, const Tensor& w, const Tensor& y) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), w.size(0),
          w.size(2), w.size(3), y.size(2), y.size(3)};
}

// The three products of a sample's unfolded patches, each one single-threaded BLAS call.
// w [O, K], cols [K, P], dy and y [O, P].

// y [O, P] = bias + w @ cols (bias may be null)
template <typename T>
void multiply_forward(const T* w, const T* bias, const T* cols, const ConvShape& s, T* y) {
  const int64_t k = s.patch(), p = s.pixels();
  for (int64_t o = 0; o < s.o; ++o) std::fill(y + o * p, y + (o + 1) * p, bias ? bias[o] : T(0));
  blas(CblasNoTrans, CblasNoTrans, int(s.o), int(p), int(k), T(1), w, std::max<int>(k, 1), cols,
       int(p), T(1), y, int(p));
}

// dcols [K, P] = w^T @ dy
template <typename T>
void multiply_data(const T* w, const T* dy, const ConvShape& s, T* dcols) {
  const int64_t k = s.patch(), p = s.pixels();
  blas(CblasTrans, CblasNoTrans, int(k), int(p), int(s.o), T(1), w, std::max<int>(k, 1), dy, int(p),
       T(0), dcols, int(p));
}

// dw [O, K] = beta dw + dy @ cols^T (beta 0 or 1) for dy [O, P'] and cols [K, P'], P' the pixels
// of the samples unfolded side by side; or, with `transposed`, the same as dw^T [K, O] =
// beta dw^T + cols @ dy^T. Where OpenBLAS's kernels make the two the same sums
// (blas_transposes_exactly: its AVX-512 kernels), the transposed one runs conv2's
// [64, 588] x [588, 288] at 15-20% more FLOP/s (a cblas harness, one thread, 126 -> 150 GFLOP/s;
// identical bytes for k from 196 to 3136); its AVX2 kernels round the two differently. float32
// only: the premise was measured on sgemm.
template <typename T>
void multiply_filter(const T* dy, const T* cols, const ConvShape& s, int64_t p, T beta,
                     bool transposed, T* dw) {
  const int k = int(s.patch()), o = int(s.o), ld = std::max<int>(int(p), 1);
  if (transposed) {
    blas(CblasNoTrans, CblasTrans, k, o, int(p), T(1), cols, ld, dy, ld, beta, dw,
         std::max<int>(o, 1));
  } else {
    blas(CblasNoTrans, CblasTrans, o, k, int(p), T(1), dy, ld, cols, ld, beta, dw,
         std::max<int>(k, 1));
  }
}

template <typename T>
void forward(const T* x, const T* w, const T* bias, const ConvShape& s, const Conv2dGeometry& g,
             DType dtype, T* y) {
  // per sample: y[n] [O, OH OW] = bias + w [O, C KH KW] @ cols [C KH KW, OH OW]
  check_blas_sizes(s, "conv2d");
  ThreadScratch<T> cols(1, s.patch() * s.pixels() + padded_plane(s, g).size(), dtype);
  for_library_calls(s.n, s.macs() >= kParallelMacs, [&](int64_t n) {
    T* unfolded = cols.mine();
    im2col(x + n * s.image(), s, g, unfolded + s.patch() * s.pixels(), unfolded, s.pixels());
    multiply_forward(w, bias, unfolded, s, y + n * s.output());
  });
}

template <typename T>
void backward_data(const T* dy, const T* w, const ConvShape& s, const Conv2dGeometry& g,
                   DType dtype, T* dx) {
  // per sample: dcols [C KH KW, OH OW] = w^T @ dy[n] [O, OH OW], folded back into dx[n]
  check_blas_sizes(s, "conv2d_backward_data");
  ThreadScratch<T> dcols(1, s.patch() * s.pixels() + padded_plane(s, g).size(), dtype);
  for_library_calls(s.n, s.macs() >= kParallelMacs, [&](int64_t n) {
    T* folded = dcols.mine();
    multiply_data(w, dy + n * s.output(), s, folded);
    col2im(folded, s, g, folded + s.patch() * s.pixels(), dx + n * s.image());
  });
}

// Columns of the partial sums added side by side when the chunks are combined.
constexpr int64_t kSumSpan = 64;

template <typename T>
void backward_filter(const T* dy, const T* x, const ConvShape& s, const Conv2dGeometry& g,
                     double beta, DType dtype, T* dw) {
  // dw [O, C KH KW] = beta dw + sum over chunks of (sum over the chunk's samples of
  // dy[n] [O, OH OW] @ cols(x[n])^T), each chunk's partial sum [O, C KH KW] or its transpose
  check_blas_sizes(s, "conv2d_backward_filter");
  const FilterChunks fc = filter_chunks(s, sizeof(T));
  const int64_t per_chunk = fc.per_chunk, chunks = fc.chunks, lowered = fc.lowered;
  const int64_t weights = s.o * s.patch();
  ThreadScratch<T> scratch(1, fc.scratch(s, g), dtype);
  Tensor partials = Tensor::empty({chunks, weights}, dtype, Device::cpu());
  T* partial = partials.data<T>();
  const bool transposed = std::is_same_v<T, float> && blas_transposes_exactly();
  for_library_calls(chunks, s.macs() >= kParallelMacs, [&](int64_t chunk) {
    const int64_t first = chunk * per_chunk, end = std::min(s.n, first + per_chunk);
    for (int64_t group = first; group < end; group += lowered) {
      const int64_t m = std::min(lowered, end - group), p = m * s.pixels();
      T* cols = scratch.mine();            // [K, m P]
      T* gathered = cols + s.patch() * p;  // [O, m P]
      lower_samples(x, dy, s, g, group, m, cols, gathered);
      multiply_filter(gathered, cols, s, p, group == first ? T(0) : T(1), transposed,
                      partial + chunk * weights);
    }
  });
  // dw [o, k] = beta dw + the chunks' partial sums in order, a row of the partial sums at a time
  // (row k of [K, O] when transposed, else row o of [O, K]), kSumSpan columns of it summed side by
  // side; parallel by the reads (every chunk's), which the weights alone would not be.
  const int64_t rows = transposed ? s.patch() : s.o, cols = weights / std::max<int64_t>(rows, 1);
  const int64_t row_step = transposed ? 1 : cols, col_step = transposed ? rows : 1;
  for_range(rows, chunks * weights, [=](int64_t r) {
    for (int64_t c0 = 0; c0 < cols; c0 += kSumSpan) {
      const int64_t span = std::min(kSumSpan, cols - c0);
      T total[kSumSpan] = {};
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const T* row = partial + chunk * weights + r * cols + c0;
        for (int64_t j = 0; j < span; ++j) total[j] += row[j];
      }
      for (int64_t j = 0; j < span; ++j) {
        T& out = dw[r * row_step + (c0 + j) * col_step];
        out = beta == 0 ? total[j] : T(beta) * out + total[j];
      }
    }
  });
}

// The direct filter gradient, for patches of at most kDirectPatch values (conv1's one input
// channel: 9). A sample's unfolded patches cols [K, P] are small (28 KiB at 28 x 28), and dy is
// read where it lies: for each out channel, the K dot products of its dy row with the K rows of
// cols run side by side in kLanes-wide vector lanes, the K x kLanes sums held in registers, and
// each lane's sums are added in lane order at the end. The GEMM it replaces ([O, P] x [P, K], with
// dy gathered beside the patches) ran at a fifth of the GEMM rate for so narrow a product.
constexpr int64_t kDirectPatch = 9;
constexpr int kLanes = 16;

// kLanes values of T as one vector (kernels/cpu/vec.h, so the K sums stay in registers).
template <typename T>
using Lanes = vec::Vec<T, kLanes>;
template <typename T>
Lanes<T> load_lanes(const T* p) {
  return vec::load<T, kLanes>(p);
}
template <typename T>
T add_lanes(const Lanes<T>& v) {  // in lane order
  T total = 0;
  for (int lane = 0; lane < kLanes; ++lane) total += v[lane];
  return total;
}

// dw [O, K] += dy [O, P] @ cols [K, P]^T and, with dbias, dbias [O] += the sums of dy's rows (the
// bias gradient, from the rows already in registers). A 16-bit dy (D) is widened as it is loaded.
template <typename T, int K, typename D>
void filter_dots(const D* dy, const T* cols, int64_t outs, int64_t pixels, T* dw, T* dbias) {
  for (int64_t o = 0; o < outs; ++o) {
    const D* row = dy + o * pixels;
    Lanes<T> sums[K] = {};
    Lanes<T> row_sum = {};
    int64_t p = 0;
    for (; p + kLanes <= pixels; p += kLanes) {
      const Lanes<T> d = vec::load_widened<D, kLanes>(row + p);
      row_sum += d;
      for (int k = 0; k < K; ++k) sums[k] += d * load_lanes(cols + k * pixels + p);
    }
    for (int lane = 0; p + lane < pixels; ++lane) {  // the tail: lanes 0 ...
      const T d = load(row[p + lane]);
      row_sum[lane] += d;
      for (int k = 0; k < K; ++k) sums[k][lane] += d * cols[k * pixels + p + lane];
    }
    for (int k = 0; k < K; ++k) dw[o * K + k] += add_lanes<T>(sums[k]);
    if (dbias) dbias[o] += add_lanes<T>(row_sum);
  }
}

// body(std::integral_constant<int, k>) for the patch size k (1 ... Max): the direct kernels'
// patch size as a compile-time constant, so their K sums or taps stay in registers.
template <int Max = int(kDirectPatch), typename F>
void with_patch_size(int64_t k, F body) {
  if (k == Max) {
    body(std::integral_constant<int, Max>());
  } else if constexpr (Max > 1) {
    with_patch_size<Max - 1>(k, body);
  }
}

// A sample's planes x[n] [C, H, W] in the compute type: 16-bit ones widened into `wide`, float
// and double ones where they lie.
template <typename S, typename T = compute_t<S>>
const T* sample_in_compute_type(const S* x, const ConvShape& s, int64_t n, T* wide) {
  if constexpr (is_half_v<S>) {
    row_to_float(x + n * s.image(), wide, s.image());
    return wide;
  } else {
    return x + n * s.image();
  }
}

// S: x's and dy's type; 16-bit ones sum in float32 (their samples widened before they are
// unfolded, dy as it is loaded), dw and dbias (O) float32 or 16-bit, rounded once.
template <typename S, typename O>
void backward_filter_direct(const S* dy, const S* x, const ConvShape& s, const Conv2dGeometry& g,
                            double beta, O* dw, O* dbias) {
  // dw [O, K] = beta dw + sum over chunks of (sum over the chunk's samples of
  // dy[n] [O, OH OW] @ cols(x[n])^T), the chunks as in backward_filter; dbias [O] likewise from
  // the sums of dy's rows (dbias may be null)
  using T = compute_t<S>;
  const FilterChunks fc = filter_chunks(s, sizeof(S));
  const int64_t per_chunk = fc.per_chunk, chunks = fc.chunks, weights = s.o * s.patch();
  const int64_t sums = weights + s.o;  // per chunk: dw's, then dbias's
  const int64_t unfolded = s.patch() * s.pixels() + padded_plane(s, g).size();
  ThreadScratch<T> scratch(1, unfolded + (is_half_v<S> ? s.image() : 0), dtype_of<T>());
  Tensor partials = Tensor::zeros({chunks, sums}, dtype_of<T>(), Device::cpu());
  T* partial = partials.data<T>();
  for_library_calls(chunks, s.macs() >= kParallelMacs, [&](int64_t chunk) {
    T* cols = scratch.mine();
    T* mine = partial + chunk * sums;
    const int64_t first = chunk * per_chunk, end = std::min(s.n, first + per_chunk);
    for (int64_t n = first; n < end; ++n) {
      const T* image = sample_in_compute_type(x, s, n, cols + unfolded);
      im2col(image, s, g, cols + s.patch() * s.pixels(), cols, s.pixels());
      with_patch_size(s.patch(), [&](auto k) {
        filter_dots<T, k()>(dy + n * s.output(), cols, s.o, s.pixels(), mine,
                            dbias ? mine + weights : nullptr);
      });
    }
  });
  for_each(dbias ? sums : weights, [=](int64_t i) {
    T total = 0;
    for (int64_t c = 0; c < chunks; ++c) total += partial[c * sums + i];
    O* out = i < weights ? dw + i : dbias + (i - weights);
    *out = store<O>(beta == 0 ? total : T(beta) * T(load(*out)) + total);
  });
}

// The direct forward, for patches of at most kDirectPatch values at stride 1 along rows (conv1:
// one input channel, 3 x 3). A block of kLanes outputs of an output row reads each tap as one
// vector of the padded input planes (a tap of the block is kLanes consecutive values there), and
// every out channel's outputs are that channel's multiply-adds over the K taps held in registers,
// then its bias: im2col's [O, K] x [K, P] product without writing the unfolded patches out or
// reading them back. The sums are the ones OpenBLAS's AVX-512 kernels compute for so short a
// product, one multiply-add chain from zero in tap order, then added to the bias
// (blas_chains_short_products), so there it gives im2col's bytes.
// A 16-bit y (Y) takes each output rounded once from its float32 sum.
template <typename T, int K, typename Y>
void forward_direct_rows(const T* padded, const int64_t* tap_at, const T* w, const T* bias,
                         const ConvShape& s, int64_t row_step, Y* y) {
  // padded [C, rows, cols] -> y [O, OH, OW]; output (oh, ow) reads tap k at
  // padded[oh row_step + ow + tap_at[k]]
  using V = vec::Vec<T, kLanes>;
  for (int64_t oh = 0; oh < s.oh; ++oh) {
    const T* row = padded + oh * row_step;
    for (int64_t j = 0;; j += kLanes) {
      const int64_t first = std::min(j, s.ow - kLanes);  // the last block ends at the row's end
      V taps[K];
      for (int k = 0; k < K; ++k) taps[k] = vec::load<T, kLanes>(row + first + tap_at[k]);
      Y* out = y + oh * s.ow + first;
      for (int64_t o = 0; o < s.o; ++o) {
        const T* wo = w + o * K;
        V sum{};  // a multiply-add onto +0 first, as the GEMM's (a -0 product gives +0)
        for (int k = 0; k < K; ++k) sum = vec::fma(vec::splat<V>(wo[k]), taps[k], sum);
        vec::store_rounded(out + o * s.pixels(), (bias ? bias[o] : T(0)) + sum);
      }
      if (first + kLanes >= s.ow) break;
    }
  }
}

// S: x's, w's, bias's and y's type; 16-bit ones sum in float32 (the weights and bias widened
// once, each sample as it is padded) and y is rounded once.
template <typename S>
void forward_direct(const S* x, const S* w, const S* bias, const ConvShape& s,
                    const Conv2dGeometry& g, S* y) {
  // per sample: y[n] [O, OH OW] = bias + w [O, C KH KW] @ the taps, C padded planes at a time
  using T = compute_t<S>;
  const PaddedPlane plane = padded_plane(s, g);
  int64_t tap_at[kDirectPatch];
  for_taps(s, [&](int64_t row, int64_t c, int64_t ki, int64_t kj) {
    tap_at[row] = c * plane.size() + ki * g.dilation_h * plane.cols + kj * g.dilation_w;
  });
  const int64_t weights = s.o * s.patch();
  Tensor widened;  // 16-bit weights and bias in float32
  const T* w_t = nullptr;
  const T* bias_t = nullptr;
  if constexpr (is_half_v<S>) {
    widened = Tensor::empty({weights + s.o}, dtype_of<T>(), Device::cpu());
    T* wide = widened.data<T>();
    row_to_float(w, wide, weights);
    if (bias) row_to_float(bias, wide + weights, s.o);
    w_t = wide;
    bias_t = bias ? wide + weights : nullptr;
  } else {
    w_t = w;
    bias_t = bias;
  }
  const int64_t planes = s.c * plane.size();
  ThreadScratch<T> scratch(1, planes + (is_half_v<S> ? s.image() : 0), dtype_of<T>());
  std::fill_n(scratch.buffer.template data<T>(), scratch.buffer.numel(), T(0));  // zero borders
  for_library_calls(s.n, s.macs() >= kParallelMacs, [&](int64_t n) {
    T* padded = scratch.mine();
    const T* image = sample_in_compute_type(x, s, n, padded + planes);
    for (int64_t c = 0; c < s.c; ++c) {
      pad_plane(image + c * s.h * s.w, s, g, padded + c * plane.size());
    }
    with_patch_size(s.patch(), [&](auto k) {
      forward_direct_rows<T, k()>(padded, tap_at, w_t, bias_t, s, g.stride_h * plane.cols,
                                  y + n * s.output());
    });
  });
}

}  // namespace

// Winograd where its 16 products per tile pay for the transforms (bench/kernels.cpp, conv2d_*,
// the algorithms forced, b = 32): at conv2's 32 -> 64 channels it runs the forward and data
// passes 1.2-1.6x faster than im2col; at conv1's one input channel 3-5x slower, the transforms
// being the whole cost. The cut at 8 lies between the two measured shapes.
constexpr int64_t kWinogradMinChannels = 8;

namespace {
thread_local int forced_algorithm = -1;  // a ConvAlgorithm, or -1: none forced
}  // namespace

const char* conv_algorithm_name(ConvAlgorithm algorithm) {
  switch (algorithm) {
    case ConvAlgorithm::kWinograd:
      return "winograd";
    case ConvAlgorithm::kDirect:
      return "direct";
    default:
      return "im2col";
  }
}

bool direct_applies(const ConvShape& s, const Conv2dGeometry& g, ConvPass pass) {
  const bool small_patch = s.patch() >= 1 && s.patch() <= kDirectPatch;
  if (pass == ConvPass::kForward) return small_patch && g.stride_w == 1 && s.ow >= kLanes;
  return pass == ConvPass::kBackwardFilter && small_patch;
}

bool winograd_applies(const ConvShape& s, const Conv2dGeometry& g, ConvPass pass) {
  return pass != ConvPass::kBackwardFilter && s.kh == 3 && s.kw == 3 && g.stride_h == 1 &&
         g.stride_w == 1 && g.dilation_h == 1 && g.dilation_w == 1 && g.pad_h >= 0 &&
         g.pad_h <= 2 && g.pad_w >= 0 && g.pad_w <= 2;
}

ConvAlgorithm conv_algorithm(const ConvShape& s, const Conv2dGeometry& g, ConvPass pass) {
  const bool direct = direct_applies(s, g, pass), winograd = winograd_applies(s, g, pass);
  if (forced_algorithm >= 0) {
    const auto forced = static_cast<ConvAlgorithm>(forced_algorithm);
    if (forced == ConvAlgorithm::kIm2col || (forced == ConvAlgorithm::kDirect && direct) ||
        (forced == ConvAlgorithm::kWinograd && winograd)) {
      return forced;
    }
  }
  // the direct forward only where it gives im2col's bytes
  if (direct && (pass != ConvPass::kForward || blas_chains_short_products())) {
    return ConvAlgorithm::kDirect;
  }
  return winograd && s.c >= kWinogradMinChannels && s.o >= kWinogradMinChannels
             ? ConvAlgorithm::kWinograd
             : ConvAlgorithm::kIm2col;
}

// 16-bit convolutions take the direct kernels wherever they apply (their float32 sums are not
// pinned to a library's order, as float32's forward is to im2col's), unless another algorithm is
// forced; elsewhere they lower (conv_half.cpp).
namespace {
bool half_direct(const ConvShape& s, const Conv2dGeometry& g, ConvPass pass) {
  return direct_applies(s, g, pass) &&
         (forced_algorithm < 0 || forced_algorithm == static_cast<int>(ConvAlgorithm::kDirect));
}
}  // namespace

ForcedConvAlgorithm::ForcedConvAlgorithm(ConvAlgorithm algorithm) : previous_(forced_algorithm) {
  forced_algorithm = static_cast<int>(algorithm);
}
ForcedConvAlgorithm::~ForcedConvAlgorithm() {
  forced_algorithm = previous_;
}

void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Conv2dGeometry& g, Tensor& y) {
  const ConvShape s = conv_shape(x, w, y);
  if (y.numel() == 0) return;
  if (is_half(x.dtype())) {
    ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "conv2d", [&] {
      if constexpr (is_half_v<T>) {
        if (half_direct(s, g, ConvPass::kForward)) {
          forward_direct(x.data<T>(), w.data<T>(), optional_data<T>(bias), s, g, y.data<T>());
        } else {
          half_conv::forward(x.data<T>(), w.data<T>(), optional_data<T>(bias), s, g, y.data<T>());
        }
      }
    });
    return;
  }
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "conv2d", [&] {
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    const ConvAlgorithm algorithm = conv_algorithm(s, g, ConvPass::kForward);
    if (algorithm == ConvAlgorithm::kWinograd) {
      winograd::forward(x.data<T>(), w.data<T>(), b, s, g, x.dtype(), y.data<T>());
    } else if (algorithm == ConvAlgorithm::kDirect) {
      forward_direct(x.data<T>(), w.data<T>(), b, s, g, y.data<T>());
    } else {
      forward(x.data<T>(), w.data<T>(), b, s, g, x.dtype(), y.data<T>());
    }
  });
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Conv2dGeometry& g,
                                      Tensor& dx) {
  const ConvShape s = conv_shape(dx, w, dy);
  if (dx.numel() == 0) return;
  if (is_half(dy.dtype())) {
    ACCRUE_DISPATCH_FLOATING_AND_HALF(dy.dtype(), "conv2d_backward_data", [&] {
      if constexpr (is_half_v<T>) {
        half_conv::backward_data(dy.data<T>(), w.data<T>(), s, g, dx.data<T>());
      }
    });
    return;
  }
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "conv2d_backward_data", [&] {
    if (conv_algorithm(s, g, ConvPass::kBackwardData) == ConvAlgorithm::kWinograd) {
      winograd::backward_data(dy.data<T>(), w.data<T>(), s, g, dy.dtype(), dx.data<T>());
    } else {
      backward_data(dy.data<T>(), w.data<T>(), s, g, dy.dtype(), dx.data<T>());
    }
  });
}

void CpuBackend::conv2d_backward_filter(const Tensor& dy, const Tensor& x, const Conv2dGeometry& g,
                                        double beta, Tensor& dw, Tensor& dbias) {
  const ConvShape s = conv_shape(x, dw, dy);
  if (is_half(dy.dtype())) {
    ACCRUE_DISPATCH_FLOATING_AND_HALF(dy.dtype(), "conv2d_backward_filter", [&] {
      if constexpr (is_half_v<T>) {
        if (dbias.defined() && dbias.dtype() != dw.dtype()) {
          throw DTypeError(str_cat("[conv2d_backward_filter] dw is ", dtype_name(dw.dtype()),
                                   " but dbias is ", dtype_name(dbias.dtype())));
        }
        with_wide_output<T>(dw, "conv2d_backward_filter", [&](auto* out) {
          using O = std::remove_pointer_t<decltype(out)>;
          O* db = dbias.defined() ? dbias.data<O>() : nullptr;
          if (dw.numel() > 0 && half_direct(s, g, ConvPass::kBackwardFilter)) {
            backward_filter_direct(dy.data<T>(), x.data<T>(), s, g, beta, out, db);
          } else {
            half_conv::backward_filter(dy.data<T>(), x.data<T>(), s, g, beta, out, db);
          }
        });
      }
    });
    return;
  }
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "conv2d_backward_filter", [&] {
    T* db = dbias.defined() ? dbias.data<T>() : nullptr;
    if (dw.numel() > 0 &&
        conv_algorithm(s, g, ConvPass::kBackwardFilter) == ConvAlgorithm::kDirect) {
      backward_filter_direct(dy.data<T>(), x.data<T>(), s, g, beta, dw.data<T>(), db);
      return;
    }
    if (dw.numel() > 0)
      backward_filter(dy.data<T>(), x.data<T>(), s, g, beta, dy.dtype(), dw.data<T>());
    if (db) bias_gradient(dy.data<T>(), s, beta, db);
  });
}

}  // namespace accrue::cpu
