// CPU convolution, NCHW, as im2col + GEMM, one sample at a time: the sample's input patches are
// unfolded into cols [C KH KW, OH OW] and multiplied by the weight viewed as [O, C KH KW], which
// writes the sample's output [O, OH OW] in NCHW order directly. The GEMMs are the backend's own
// (gemm.cpp: OpenBLAS under accrue's fixed cut, so results do not depend on the thread count);
// the filter gradient accumulates into the gradient arena with beta = 1. The unfolded patches
// are a temporary from the caching allocator, so they count as activation memory.
// bench/kernels.cpp measures it against the same-run GEMM.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"

namespace accrue::cpu {

namespace {

// The sizes of one convolution, read off its tensors.
struct ConvShape {
  int64_t n, c, h, w, o, kh, kw, oh, ow;
  int64_t patch() const { return c * kh * kw; }  // rows of cols
  int64_t pixels() const { return oh * ow; }     // columns of cols
};

ConvShape conv_shape(const Tensor& x, const Tensor& w, const Tensor& y) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), w.size(0),
          w.size(2), w.size(3), y.size(2), y.size(3)};
}

// cols [C KH KW, OH OW] = the patches of one sample x [C, H, W]; zeros where a patch reaches
// into the padding.
template <typename T>
void im2col(const T* x, const ConvShape& s, const Conv2dGeometry& g, T* cols) {
  for_range(s.patch(), s.patch() * s.pixels(), [=](int64_t row) {
    const int64_t c = row / (s.kh * s.kw), ki = row / s.kw % s.kh, kj = row % s.kw;
    T* out = cols + row * s.pixels();
    for (int64_t oh = 0; oh < s.oh; ++oh) {
      const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const int64_t iw = ow * g.stride_w - g.pad_w + kj * g.dilation_w;
        const bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
        out[oh * s.ow + ow] = inside ? x[(c * s.h + ih) * s.w + iw] : T(0);
      }
    }
  });
}

// dx [C, H, W] of one sample += the patches' gradients dcols [C KH KW, OH OW] folded back.
// Channels run in parallel (a channel's rows all land in its own plane); rows in order.
template <typename T>
void col2im(const T* dcols, const ConvShape& s, const Conv2dGeometry& g, T* dx) {
  for_range(s.c, s.patch() * s.pixels(), [=](int64_t c) {
    T* plane = dx + c * s.h * s.w;
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      for (int64_t kj = 0; kj < s.kw; ++kj) {
        const T* in = dcols + ((c * s.kh + ki) * s.kw + kj) * s.pixels();
        for (int64_t oh = 0; oh < s.oh; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + ki * g.dilation_h;
          if (ih < 0 || ih >= s.h) continue;
          for (int64_t ow = 0; ow < s.ow; ++ow) {
            const int64_t iw = ow * g.stride_w - g.pad_w + kj * g.dilation_w;
            if (iw >= 0 && iw < s.w) plane[ih * s.w + iw] += in[oh * s.ow + ow];
          }
        }
      }
    }
  });
}

}  // namespace

void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Conv2dGeometry& g, Tensor& y) {
  // per sample: y[n] [O, OH OW] = w [O, C KH KW] @ cols [C KH KW, OH OW] (+ bias per row)
  const ConvShape s = conv_shape(x, w, y);
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "conv2d", [&] {
    Tensor cols = Tensor::empty({s.patch(), s.pixels()}, x.dtype(), x.device());
    const Tensor w2 = w.view({s.o, s.patch()});
    for (int64_t n = 0; n < s.n; ++n) {
      im2col(x.data<T>() + n * s.c * s.h * s.w, s, g, cols.data<T>());
      Tensor yn = y.narrow(n, 1).view({s.o, s.pixels()});
      gemm(false, false, 1.0, w2, cols, 0.0, yn);
      if (bias.defined()) {
        const T* b = bias.data<T>();
        T* out = yn.data<T>();
        const int64_t pixels = s.pixels();
        for_rows(s.o, pixels, [=](int64_t o) {
          for (int64_t i = 0; i < pixels; ++i) out[o * pixels + i] += b[o];
        });
      }
    }
  });
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Conv2dGeometry& g,
                                      Tensor& dx) {
  // per sample: dcols [C KH KW, OH OW] = w^T @ dy[n] [O, OH OW], folded back into dx[n]
  const ConvShape s = conv_shape(dx, w, dy);
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "conv2d_backward_data", [&] {
    Tensor dcols = Tensor::empty({s.patch(), s.pixels()}, dy.dtype(), dy.device());
    const Tensor w2 = w.view({s.o, s.patch()});
    T* out = dx.data<T>();
    std::memset(out, 0, dx.nbytes());
    for (int64_t n = 0; n < s.n; ++n) {
      const Tensor dyn = dy.narrow(n, 1).view({s.o, s.pixels()});
      gemm(true, false, 1.0, w2, dyn, 0.0, dcols);
      col2im(dcols.data<T>(), s, g, out + n * s.c * s.h * s.w);
    }
  });
}

void CpuBackend::conv2d_backward_filter(const Tensor& dy, const Tensor& x, const Conv2dGeometry& g,
                                        double beta, Tensor& dw, Tensor& dbias) {
  // dw [O, C KH KW] = beta dw + sum_n dy[n] [O, OH OW] @ cols(x[n])^T; dbias = beta dbias +
  // sum over n and pixels of dy
  const ConvShape s = conv_shape(x, dw, dy);
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "conv2d_backward_filter", [&] {
    Tensor cols = Tensor::empty({s.patch(), s.pixels()}, x.dtype(), x.device());
    Tensor dw2 = dw.view({s.o, s.patch()});
    for (int64_t n = 0; n < s.n; ++n) {
      im2col(x.data<T>() + n * s.c * s.h * s.w, s, g, cols.data<T>());
      const Tensor dyn = dy.narrow(n, 1).view({s.o, s.pixels()});
      gemm(false, true, 1.0, dyn, cols, n == 0 ? beta : 1.0, dw2);
    }
    if (dbias.defined()) {
      const T* d = dy.data<T>();
      T* b = dbias.data<T>();
      const int64_t pixels = s.pixels(), per_sample = s.o * pixels, samples = s.n;
      for_range(s.o, s.n * per_sample, [=](int64_t o) {
        double total = 0;  // samples and pixels in order: deterministic
        for (int64_t n = 0; n < samples; ++n) {
          const T* row = d + n * per_sample + o * pixels;
          for (int64_t i = 0; i < pixels; ++i) total += static_cast<double>(row[i]);
        }
        b[o] = static_cast<T>(beta == 0 ? total : beta * static_cast<double>(b[o]) + total);
      });
    }
  });
}

}  // namespace accrue::cpu
