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
// twice the rate of the earlier per-sample products threaded by the GEMM cut (16-column blocks of
// a [64, 288] x [288, 196] product). For a one-channel conv1, rows of multiply-adds over the
// unfolded patches (each output row read and written once per tap) run slower than a K = 9 BLAS
// call in all three passes, so the direct kernels below keep a block's sums in registers.
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm_cut.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec.h"
#include "kernels/dispatch.h"

namespace accrue::cpu {

namespace {

ConvShape conv_shape(const Tensor& x, const Tensor& w, const Tensor& y) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), w.size(0),
          w.size(2), w.size(3), y.size(2), y.size(3)};
}

// The output columns [lo, hi) whose input column ow * stride + offset lies in [0, in).
struct Span {
  int64_t lo, hi;
};
Span inside(int64_t out, int64_t in, int64_t stride, int64_t offset) {
  const int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t hi = in - offset <= 0 ? 0 : (in - offset + stride - 1) / stride;
  return {std::min(lo, out), std::max(std::min(lo, out), std::min(hi, out))};
}

// body(oh, ih, span, col0) for each output row oh of tap (ki, kj) whose input row ih exists: its
// output columns in span read input columns ow * stride_w + col0.
template <typename F>
void for_tap_rows(const ConvShape& s, const Conv2dGeometry& g, int64_t ki, int64_t kj, F body) {
  const int64_t col0 = kj * g.dilation_w - g.pad_w;
  const Span span = inside(s.ow, s.w, g.stride_w, col0);
  for (int64_t oh = 0; oh < s.oh; ++oh) {
    const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
    if (ih >= 0 && ih < s.h) body(oh, ih, span, col0);
  }
}

// body(row, c, ki, kj) for every tap, row = its index in [C KH KW] (the weight's inner order).
template <typename F>
void for_taps(const ConvShape& s, F body) {
  for (int64_t c = 0; c < s.c; ++c) {
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      for (int64_t kj = 0; kj < s.kw; ++kj) body((c * s.kh + ki) * s.kw + kj, c, ki, kj);
    }
  }
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

// One input plane [H, W] inside its zero padding: [H + 2 pad_h, W + 2 pad_w]. im2col copies each
// tap's rows out of it, so no tap needs bounds or fills of its own.
struct PaddedPlane {
  int64_t rows, cols;
  int64_t size() const { return rows * cols; }
};
PaddedPlane padded_plane(const ConvShape& s, const Conv2dGeometry& g) {
  return {s.h + 2 * g.pad_h, s.w + 2 * g.pad_w};
}

// cols [C KH KW, OH OW] (rows ld apart) = the patches of one sample x [C, H, W], zeros where a
// patch reaches into the padding. Each channel is copied into the padded plane (whose border
// stays zero from the first fill), then each tap is OH rows of OW values read from it.
// Measured (bench, b = 32) against the earlier spans of the unpadded input, whose short row copies
// were library calls: conv2's filter gradient 2.26 -> 1.79 ms, conv1's im2col forward 186 -> 146
// us.
// The padded plane's inside = one input plane [H, W]; its border is left as it is (zero).
template <typename T>
void pad_plane(const T* in, const ConvShape& s, const Conv2dGeometry& g, T* padded) {
  const PaddedPlane plane = padded_plane(s, g);
  for (int64_t ih = 0; ih < s.h; ++ih) {
    vec::copy_row(in + ih * s.w, s.w, padded + (ih + g.pad_h) * plane.cols + g.pad_w);
  }
}

template <typename T>
void im2col(const T* x, const ConvShape& s, const Conv2dGeometry& g, T* padded, T* cols,
            int64_t ld) {
  const PaddedPlane plane = padded_plane(s, g);
  std::fill(padded, padded + plane.size(), T(0));
  for (int64_t c = 0; c < s.c; ++c) {
    pad_plane(x + c * s.h * s.w, s, g, padded);
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      for (int64_t kj = 0; kj < s.kw; ++kj) {
        const T* tap = padded + ki * g.dilation_h * plane.cols + kj * g.dilation_w;
        T* out = cols + ((c * s.kh + ki) * s.kw + kj) * ld;
        for (int64_t oh = 0; oh < s.oh; ++oh) {
          const T* src = tap + oh * g.stride_h * plane.cols;
          T* dst = out + oh * s.ow;
          if (g.stride_w == 1) {
            vec::copy_row(src, s.ow, dst);
          } else {
            for (int64_t ow = 0; ow < s.ow; ++ow) dst[ow] = src[ow * g.stride_w];
          }
        }
      }
    }
  }
}

// dx [C, H, W] of one sample = the patches' gradients dcols [C KH KW, OH OW] folded back, taps
// in order.
template <typename T>
void col2im(const T* dcols, const ConvShape& s, const Conv2dGeometry& g, T* dx) {
  std::memset(dx, 0, sizeof(T) * s.image());
  for_taps(s, [&](int64_t row, int64_t c, int64_t ki, int64_t kj) {
    const T* in = dcols + row * s.pixels();
    T* plane = dx + c * s.h * s.w;
    for_tap_rows(s, g, ki, kj, [&](int64_t oh, int64_t ih, Span span, int64_t col0) {
      const int64_t first = ih * s.w + col0;  // + ow * stride_w >= 0 for ow in span
      const T* src = in + oh * s.ow;
      if (g.stride_w == 1) {
        for (int64_t ow = span.lo; ow < span.hi; ++ow) plane[first + ow] += src[ow];
      } else {
        for (int64_t ow = span.lo; ow < span.hi; ++ow) plane[first + ow * g.stride_w] += src[ow];
      }
    });
  });
}

// The shape's sizes as BLAS's int (or a ShapeError naming the op), checked once per call.
void check_blas_sizes(const ConvShape& s, const char* op) {
  blas_int(s.o, op, "out channels");
  blas_int(s.pixels(), op, "output pixels");
  blas_int(s.patch(), op, "patch size");
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
  ThreadScratch<T> dcols(s.patch(), s.pixels(), dtype);
  for_library_calls(s.n, s.macs() >= kParallelMacs, [&](int64_t n) {
    T* folded = dcols.mine();
    multiply_data(w, dy + n * s.output(), s, folded);
    col2im(folded, s, g, dx + n * s.image());
  });
}

// The filter gradient's sum over samples is cut into at most this many chunks (each a partial sum
// in its own buffer), so 2, 4 or 8 threads share them evenly; the chunks are added in order.
constexpr int64_t kFilterChunks = 8;
// Within a chunk, samples are unfolded side by side (and their dy gathered beside them) into
// one product of up to this many bytes of operands, so a call sums over several samples' pixels.
// Measured (bench, conv2d_backward_filter): conv1's (K = 9, a short product per sample) runs at
// 4 samples a call in about 300 us against 540 at one; conv2's (3 a call) is bound by the GEMM
// itself and runs alike either way.
constexpr int64_t kFilterLoweringBytes = int64_t{1} << 20;
// Columns of the partial sums added side by side when the chunks are combined.
constexpr int64_t kSumSpan = 64;

template <typename T>
void backward_filter(const T* dy, const T* x, const ConvShape& s, const Conv2dGeometry& g,
                     double beta, DType dtype, T* dw) {
  // dw [O, C KH KW] = beta dw + sum over chunks of (sum over the chunk's samples of
  // dy[n] [O, OH OW] @ cols(x[n])^T), each chunk's partial sum [O, C KH KW] or its transpose
  check_blas_sizes(s, "conv2d_backward_filter");
  const int64_t per_chunk = std::max<int64_t>(1, (s.n + kFilterChunks - 1) / kFilterChunks);
  const int64_t chunks = (s.n + per_chunk - 1) / per_chunk, weights = s.o * s.patch();
  const int64_t operands = (s.patch() + s.o) * s.pixels();  // per sample: cols and dy
  const int64_t lowered = std::clamp<int64_t>(
      kFilterLoweringBytes / std::max<int64_t>(1, operands * int64_t(sizeof(T))), 1, per_chunk);
  ThreadScratch<T> scratch(1, lowered * operands + padded_plane(s, g).size(), dtype);
  Tensor partials = Tensor::empty({chunks, weights}, dtype, Device::cpu());
  T* partial = partials.data<T>();
  const bool transposed = std::is_same_v<T, float> && blas_transposes_exactly();
  for_library_calls(chunks, s.macs() >= kParallelMacs, [&](int64_t chunk) {
    const int64_t first = chunk * per_chunk, end = std::min(s.n, first + per_chunk);
    for (int64_t group = first; group < end; group += lowered) {
      const int64_t m = std::min(lowered, end - group), p = m * s.pixels();
      T* cols = scratch.mine();            // [K, m P]
      T* gathered = cols + s.patch() * p;  // [O, m P]
      for (int64_t j = 0; j < m; ++j) {
        im2col(x + (group + j) * s.image(), s, g, gathered + s.o * p, cols + j * s.pixels(), p);
        const T* sample = dy + (group + j) * s.output();
        for (int64_t o = 0; o < s.o; ++o) {
          std::copy(sample + o * s.pixels(), sample + (o + 1) * s.pixels(),
                    gathered + o * p + j * s.pixels());
        }
      }
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
// bias gradient, from the rows already in registers)
template <typename T, int K>
void filter_dots(const T* dy, const T* cols, int64_t outs, int64_t pixels, T* dw, T* dbias) {
  for (int64_t o = 0; o < outs; ++o) {
    const T* row = dy + o * pixels;
    Lanes<T> sums[K] = {};
    Lanes<T> row_sum = {};
    int64_t p = 0;
    for (; p + kLanes <= pixels; p += kLanes) {
      const Lanes<T> d = load_lanes(row + p);
      row_sum += d;
      for (int k = 0; k < K; ++k) sums[k] += d * load_lanes(cols + k * pixels + p);
    }
    for (int lane = 0; p + lane < pixels; ++lane) {  // the tail: lanes 0 ...
      row_sum[lane] += row[p + lane];
      for (int k = 0; k < K; ++k) sums[k][lane] += row[p + lane] * cols[k * pixels + p + lane];
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

template <typename T>
void backward_filter_direct(const T* dy, const T* x, const ConvShape& s, const Conv2dGeometry& g,
                            double beta, DType dtype, T* dw, T* dbias) {
  // dw [O, K] = beta dw + sum over chunks of (sum over the chunk's samples of
  // dy[n] [O, OH OW] @ cols(x[n])^T), the chunks as in backward_filter; dbias [O] likewise from
  // the sums of dy's rows (dbias may be null)
  const int64_t per_chunk = std::max<int64_t>(1, (s.n + kFilterChunks - 1) / kFilterChunks);
  const int64_t chunks = (s.n + per_chunk - 1) / per_chunk, weights = s.o * s.patch();
  const int64_t sums = weights + s.o;  // per chunk: dw's, then dbias's
  ThreadScratch<T> scratch(1, s.patch() * s.pixels() + padded_plane(s, g).size(), dtype);
  Tensor partials = Tensor::zeros({chunks, sums}, dtype, Device::cpu());
  T* partial = partials.data<T>();
  for_library_calls(chunks, s.macs() >= kParallelMacs, [&](int64_t chunk) {
    T* cols = scratch.mine();
    T* mine = partial + chunk * sums;
    const int64_t first = chunk * per_chunk, end = std::min(s.n, first + per_chunk);
    for (int64_t n = first; n < end; ++n) {
      im2col(x + n * s.image(), s, g, cols + s.patch() * s.pixels(), cols, s.pixels());
      with_patch_size(s.patch(), [&](auto k) {
        filter_dots<T, k()>(dy + n * s.output(), cols, s.o, s.pixels(), mine,
                            dbias ? mine + weights : nullptr);
      });
    }
  });
  for_each(dbias ? sums : weights, [=](int64_t i) {
    T total = 0;
    for (int64_t c = 0; c < chunks; ++c) total += partial[c * sums + i];
    T* out = i < weights ? dw + i : dbias + (i - weights);
    *out = beta == 0 ? total : T(beta) * *out + total;
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
template <typename T, int K>
void forward_direct_rows(const T* padded, const int64_t* tap_at, const T* w, const T* bias,
                         const ConvShape& s, int64_t row_step, T* y) {
  // padded [C, rows, cols] -> y [O, OH, OW]; output (oh, ow) reads tap k at
  // padded[oh row_step + ow + tap_at[k]]
  using V = vec::Vec<T, kLanes>;
  for (int64_t oh = 0; oh < s.oh; ++oh) {
    const T* row = padded + oh * row_step;
    for (int64_t j = 0;; j += kLanes) {
      const int64_t first = std::min(j, s.ow - kLanes);  // the last block ends at the row's end
      V taps[K];
      for (int k = 0; k < K; ++k) taps[k] = vec::load<T, kLanes>(row + first + tap_at[k]);
      T* out = y + oh * s.ow + first;
      for (int64_t o = 0; o < s.o; ++o) {
        const T* wo = w + o * K;
        V sum{};  // a multiply-add onto +0 first, as the GEMM's (a -0 product gives +0)
        for (int k = 0; k < K; ++k) sum = vec::fma(vec::splat<V>(wo[k]), taps[k], sum);
        vec::store(out + o * s.pixels(), (bias ? bias[o] : T(0)) + sum);
      }
      if (first + kLanes >= s.ow) break;
    }
  }
}

template <typename T>
void forward_direct(const T* x, const T* w, const T* bias, const ConvShape& s,
                    const Conv2dGeometry& g, DType dtype, T* y) {
  // per sample: y[n] [O, OH OW] = bias + w [O, C KH KW] @ the taps, C padded planes at a time
  const PaddedPlane plane = padded_plane(s, g);
  int64_t tap_at[kDirectPatch];
  for_taps(s, [&](int64_t row, int64_t c, int64_t ki, int64_t kj) {
    tap_at[row] = c * plane.size() + ki * g.dilation_h * plane.cols + kj * g.dilation_w;
  });
  ThreadScratch<T> scratch(s.c, plane.size(), dtype);
  std::fill_n(scratch.buffer.template data<T>(), scratch.buffer.numel(), T(0));  // zero borders
  for_library_calls(s.n, s.macs() >= kParallelMacs, [&](int64_t n) {
    T* padded = scratch.mine();
    for (int64_t c = 0; c < s.c; ++c) {
      pad_plane(x + n * s.image() + c * s.h * s.w, s, g, padded + c * plane.size());
    }
    with_patch_size(s.patch(), [&](auto k) {
      forward_direct_rows<T, k()>(padded, tap_at, w, bias, s, g.stride_h * plane.cols,
                                  y + n * s.output());
    });
  });
}

// dbias [O] = beta dbias + the sum of dy over samples (in order) and pixels (in vector lanes)
template <typename T>
void bias_gradient(const T* dy, const ConvShape& s, double beta, T* dbias) {
  for_range(s.o, s.n * s.output(), [=](int64_t o) {
    double total = 0;
    for (int64_t n = 0; n < s.n; ++n) {
      const T* row = dy + n * s.output() + o * s.pixels();
      double sum = 0;  // in vector lanes: a fixed order, whatever the thread count
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < s.pixels(); ++i) sum += static_cast<double>(row[i]);
      total += sum;
    }
    dbias[o] = static_cast<T>(beta == 0 ? total : beta * static_cast<double>(dbias[o]) + total);
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
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "conv2d", [&] {
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    const ConvAlgorithm algorithm = conv_algorithm(s, g, ConvPass::kForward);
    if (algorithm == ConvAlgorithm::kWinograd) {
      winograd::forward(x.data<T>(), w.data<T>(), b, s, g, x.dtype(), y.data<T>());
    } else if (algorithm == ConvAlgorithm::kDirect) {
      forward_direct(x.data<T>(), w.data<T>(), b, s, g, x.dtype(), y.data<T>());
    } else {
      forward(x.data<T>(), w.data<T>(), b, s, g, x.dtype(), y.data<T>());
    }
  });
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Conv2dGeometry& g,
                                      Tensor& dx) {
  const ConvShape s = conv_shape(dx, w, dy);
  if (dx.numel() == 0) return;
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
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "conv2d_backward_filter", [&] {
    T* db = dbias.defined() ? dbias.data<T>() : nullptr;
    if (dw.numel() > 0 &&
        conv_algorithm(s, g, ConvPass::kBackwardFilter) == ConvAlgorithm::kDirect) {
      backward_filter_direct(dy.data<T>(), x.data<T>(), s, g, beta, dy.dtype(), dw.data<T>(), db);
      return;
    }
    if (dw.numel() > 0)
      backward_filter(dy.data<T>(), x.data<T>(), s, g, beta, dy.dtype(), dw.data<T>());
    if (db) bias_gradient(dy.data<T>(), s, beta, db);
  });
}

}  // namespace accrue::cpu
