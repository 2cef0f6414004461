// The lowering every im2col convolution shares (conv.cpp in float32 and float64, conv_half.cpp in
// 16 bits): a sample's patches unfolded into the columns of a matrix (im2col) and the patches'
// gradients folded back (col2im), both through the input plane padded with zeros, and the walk over
// a filter's taps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/geometry.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

namespace accrue::cpu::lowering {

// body(row, c, ki, kj) for every tap, row = its index in [C KH KW] (the weight's inner order).
template <typename F>
void for_taps(const ConvShape& s, F body) {
  for (int64_t c = 0; c < s.c; ++c) {
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      for (int64_t kj = 0; kj < s.kw; ++kj) body((c * s.kh + ki) * s.kw + kj, c, ki, kj);
    }
  }
}

// One input plane [H, W] inside its zero padding: [H + 2 pad_h, W + 2 pad_w]. im2col copies each
// tap's rows out of it, so no tap needs bounds or fills of its own.
struct PaddedPlane {
  int64_t rows, cols;
  int64_t size() const { return rows * cols; }
};
inline PaddedPlane padded_plane(const ConvShape& s, const Conv2dGeometry& g) {
  return {s.h + 2 * g.pad_h, s.w + 2 * g.pad_w};
}

// The padded plane's inside = one input plane [H, W]; its border is left as it is (zero).
template <typename T>
void pad_plane(const T* in, const ConvShape& s, const Conv2dGeometry& g, T* padded) {
  const int64_t h = s.h, w = s.w, cols = padded_plane(s, g).cols;
  T* inside = padded + g.pad_h * cols + g.pad_w;
  for (int64_t ih = 0; ih < h; ++ih) vec::copy_row(in + ih * w, w, inside + ih * cols);
}

// cols [C KH KW, OH OW] (rows ld apart) = the patches of one sample x [C, H, W], zeros where a
// patch reaches into the padding. Each channel is copied into the padded plane (whose border
// stays zero from the first fill), then each tap is OH rows of OW values read from it.
// (The plane's rows are copied whole rather than as clipped spans: docs/cpu-speed.md, "The CNN in
// 16 bits", has the measurements.)
// The sizes are read into locals once: the row copies store through pointers that may alias
// anything (bytes, vector types), and the compiler would otherwise reload them from s and g for
// every row.
template <typename T>
void im2col(const T* x, const ConvShape& s, const Conv2dGeometry& g, T* padded, T* cols,
            int64_t ld) {
  const PaddedPlane plane = padded_plane(s, g);
  const int64_t channels = s.c, kh = s.kh, kw = s.kw, oh_count = s.oh, ow_count = s.ow;
  const int64_t row_step = g.stride_h * plane.cols, stride_w = g.stride_w;
  const int64_t tap_row = g.dilation_h * plane.cols, tap_col = g.dilation_w;
  std::fill(padded, padded + plane.size(), T(0));
  for (int64_t c = 0; c < channels; ++c) {
    pad_plane(x + c * s.h * s.w, s, g, padded);
    for (int64_t ki = 0; ki < kh; ++ki) {
      for (int64_t kj = 0; kj < kw; ++kj) {
        const T* tap = padded + ki * tap_row + kj * tap_col;
        T* out = cols + ((c * kh + ki) * kw + kj) * ld;
        for (int64_t oh = 0; oh < oh_count; ++oh) {
          const T* src = tap + oh * row_step;
          T* dst = out + oh * ow_count;
          if (stride_w == 1) {
            vec::copy_row(src, ow_count, dst);
          } else {
            for (int64_t ow = 0; ow < ow_count; ++ow) dst[ow] = src[ow * stride_w];
          }
        }
      }
    }
  }
}

// dx [C, H, W] of one sample = the patches' gradients dcols [C KH KW, OH OW] folded back, taps
// in order. Each channel is summed in the padded plane `padded` (padded_plane's size, scratch):
// every tap adds OH whole rows of OW values there, in vector lanes, with no bounds to clip (what
// lands in the padding is dropped), and the plane's inside is copied to dx. Each element
// receives its taps' values in tap order, so the sums are those of a bounds-checked fold.
// Measurements: docs/cpu-speed.md, "The CNN in 16 bits".
template <typename T>
void col2im(const T* dcols, const ConvShape& s, const Conv2dGeometry& g, T* padded, T* dx) {
  const PaddedPlane plane = padded_plane(s, g);
  const int64_t channels = s.c, kh = s.kh, kw = s.kw, oh_count = s.oh, ow_count = s.ow;
  const int64_t pixels = s.pixels(), h = s.h, w = s.w;
  const int64_t row_step = g.stride_h * plane.cols, stride_w = g.stride_w;
  const int64_t tap_row = g.dilation_h * plane.cols, tap_col = g.dilation_w;
  const T* inside = padded + g.pad_h * plane.cols + g.pad_w;
  for (int64_t c = 0; c < channels; ++c) {
    std::fill(padded, padded + plane.size(), T(0));
    for (int64_t ki = 0; ki < kh; ++ki) {
      for (int64_t kj = 0; kj < kw; ++kj) {
        const T* in = dcols + ((c * kh + ki) * kw + kj) * pixels;
        T* tap = padded + ki * tap_row + kj * tap_col;
        for (int64_t oh = 0; oh < oh_count; ++oh) {
          const T* src = in + oh * ow_count;
          T* __restrict out = tap + oh * row_step;  // never a row of dcols
          if (stride_w == 1) {
            vec::add_row(src, ow_count, out);
          } else {
            for (int64_t ow = 0; ow < ow_count; ++ow) out[ow * stride_w] += src[ow];
          }
        }
      }
    }
    for (int64_t ih = 0; ih < h; ++ih) {
      vec::copy_row(inside + ih * plane.cols, w, dx + (c * h + ih) * w);
    }
  }
}

// The shape's sizes as BLAS's int (or a ShapeError naming the op), checked once per call.
inline void check_blas_sizes(const ConvShape& s, const char* op) {
  blas_int(s.o, op, "out channels");
  blas_int(s.pixels(), op, "output pixels");
  blas_int(s.patch(), op, "patch size");
}

// The filter gradient's sum over samples is cut into at most this many chunks (each a partial sum
// in its own buffer), so 2, 4 or 8 threads share them evenly; the chunks are added in order.
constexpr int64_t kFilterChunks = 8;
// Within a chunk, samples are unfolded side by side (and their dy gathered beside them) into
// one product of up to this many bytes of operands, so a call sums over several samples' pixels.
// A product of one sample of conv1 (K = 9) is too short to run at the library's rate; conv2's are
// not, and run alike either way (docs/cpu-speed.md, "The CNN in 16 bits").
constexpr int64_t kFilterLoweringBytes = int64_t{1} << 20;

// The filter gradient's chunks of samples (fixed by the shape alone) and the samples lowered into
// one product, for elements of `element_bytes`.
struct FilterChunks {
  int64_t per_chunk, chunks, lowered;
  // Elements of a thread's scratch: `lowered` samples' patches and dy, and a padded plane.
  int64_t scratch(const ConvShape& s, const Conv2dGeometry& g) const {
    return lowered * (s.patch() + s.o) * s.pixels() + padded_plane(s, g).size();
  }
};
inline FilterChunks filter_chunks(const ConvShape& s, size_t element_bytes) {
  const int64_t per_chunk = std::max<int64_t>(1, (s.n + kFilterChunks - 1) / kFilterChunks);
  const int64_t operands = (s.patch() + s.o) * s.pixels();  // per sample: cols and dy
  const int64_t lowered = std::clamp<int64_t>(
      kFilterLoweringBytes / std::max<int64_t>(1, operands * int64_t(element_bytes)), 1, per_chunk);
  return {per_chunk, (s.n + per_chunk - 1) / per_chunk, lowered};
}

// Samples [first, first + m) side by side: cols [K, m P] their unfolded patches, gathered [O, m P]
// their dy, the padded plane after gathered's end. P = OH OW.
template <typename T>
void lower_samples(const T* x, const T* dy, const ConvShape& s, const Conv2dGeometry& g,
                   int64_t first, int64_t m, T* cols, T* gathered) {
  const int64_t p = m * s.pixels();
  for (int64_t j = 0; j < m; ++j) {
    im2col(x + (first + j) * s.image(), s, g, gathered + s.o * p, cols + j * s.pixels(), p);
    const T* sample = dy + (first + j) * s.output();
    for (int64_t o = 0; o < s.o; ++o) {
      std::copy(sample + o * s.pixels(), sample + (o + 1) * s.pixels(),
                gathered + o * p + j * s.pixels());
    }
  }
}

// dbias [O] = beta dbias + the sum of dy over samples (in order) and pixels (in vector lanes)
template <typename T, typename O>
void bias_gradient(const T* dy, const ConvShape& s, double beta, O* dbias) {
  for_range(s.o, s.n * s.output(), [=](int64_t o) {
    double total = 0;
    for (int64_t n = 0; n < s.n; ++n) {
      const T* row = dy + n * s.output() + o * s.pixels();
      double sum = 0;  // in vector lanes: a fixed order, whatever the thread count
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < s.pixels(); ++i) sum += static_cast<double>(row[i]);
      total += sum;
    }
    dbias[o] = static_cast<O>(beta == 0 ? total : beta * static_cast<double>(dbias[o]) + total);
  });
}

}  // namespace accrue::cpu::lowering
