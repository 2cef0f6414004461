// CUDA pooling, NCHW: one thread per output element for the forward passes and for average
// pooling's backward (each input element gathers the pooling regions that cover it: no atomics, a
// fixed order); max pooling's backward scatters dy at the saved argmax one plane per thread, in
// order, skipping -1 (max_pool2d_relu's argmax where the pooled relu(x) is not positive).
#include <cfloat>

#include "core/cuda/check.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cuda {

namespace {

// The input rows [h0, h1) and columns [w0, w1) of output o's pooling region, clipped to the plane.
struct Region {
  int64_t plane, h0, h1, w0, w1;
  __device__ Region(int64_t o, int64_t h, int64_t w, int64_t oh, int64_t ow,
                    const Pool2dGeometry& g) {
    plane = o / (oh * ow);
    const int64_t sh = o / ow % oh * g.stride_h - g.pad_h, sw = o % ow * g.stride_w - g.pad_w;
    h0 = sh < 0 ? 0 : sh;
    h1 = sh + g.kernel_h < h ? sh + g.kernel_h : h;
    w0 = sw < 0 ? 0 : sw;
    w1 = sw + g.kernel_w < w ? sw + g.kernel_w : w;
  }
};

// With relu each tap competes as relu(x) and argmax is -1 where the maximum is not positive.
template <typename T>
void max_pool(const T* in, int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
              Pool2dGeometry g, bool relu, T* out, int32_t* at, cudaStream_t stream) {
  for_each(planes * oh * ow, stream, [=] __device__(int64_t o) {
    const Region win(o, h, w, oh, ow, g);
    const int64_t h0 = win.h0, h1 = win.h1, w0 = win.w0, w1 = win.w1;
    const T* plane = in + win.plane * h * w;
    T best = -T(INFINITY);
    int64_t best_at = h0 * w + w0;
    for (int64_t ih = h0; ih < h1; ++ih) {
      for (int64_t iw = w0; iw < w1; ++iw) {
        const T v = relu ? fn::Relu{}(plane[ih * w + iw]) : plane[ih * w + iw];
        if (fn::pool_beats(v, best)) {
          best = v;
          best_at = ih * w + iw;
        }
      }
    }
    out[o] = best;
    at[o] = relu ? fn::relu_pool_argmax(static_cast<int32_t>(best_at), best)
                 : static_cast<int32_t>(best_at);
  });
}

template <typename T>
void avg_pool(const T* in, int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
              Pool2dGeometry g, T* out, cudaStream_t stream) {
  const T inv = T(1) / T(g.kernel_h * g.kernel_w);
  for_each(planes * oh * ow, stream, [=] __device__(int64_t o) {
    const Region win(o, h, w, oh, ow, g);
    const T* plane = in + win.plane * h * w;
    T total = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih) {
      for (int64_t iw = win.w0; iw < win.w1; ++iw) total += plane[ih * w + iw];
    }
    out[o] = total * inv;
  });
}

// dx [planes, h, w]: each input element sums dy / region size over the regions covering it.
template <typename T>
void avg_pool_backward(const T* dy, int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
                       Pool2dGeometry g, T* dx, cudaStream_t stream) {
  const T inv = T(1) / T(g.kernel_h * g.kernel_w);
  for_each(planes * h * w, stream, [=] __device__(int64_t i) {
    const int64_t p = i / (h * w), ih = i / w % h, iw = i % w;
    T total = 0;
    for (int64_t y = 0; y < oh; ++y) {
      const int64_t sh = y * g.stride_h - g.pad_h;
      if (ih < sh || ih >= sh + g.kernel_h) continue;
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t sw = x * g.stride_w - g.pad_w;
        if (iw >= sw && iw < sw + g.kernel_w) total += dy[(p * oh + y) * ow + x];
      }
    }
    dx[i] = total * inv;
  });
}

// dy [planes, outputs], argmax -> dx [planes, area]: dx = +0 (all-zero bytes: one coalesced
// memset over the whole tensor, where a thread per plane would write with neighbouring threads a
// plane apart), then each plane's outputs add into it in order, one thread a plane, so an input
// that several windows pick sums them in a fixed order.
template <typename T>
void max_pool_backward(const T* dy, const int32_t* at, int64_t planes, int64_t area,
                       int64_t outputs, T* dx, cudaStream_t stream) {
  if (planes * area == 0) return;  // an empty dx has no memory to zero (its pointer is null)
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(dx, 0, size_t(planes * area) * sizeof(T), stream));
  for_each(planes, stream, [=] __device__(int64_t p) {
    T* plane = dx + p * area;
    for (int64_t o = 0; o < outputs; ++o) {
      const int32_t i = at[p * outputs + o];
      if (i >= 0) plane[i] += dy[p * outputs + o];
    }
  });
}

}  // namespace

void CudaBackend::max_pool2d(const Tensor& x, const Pool2dGeometry& g, bool relu, Tensor& y,
                             Tensor& argmax) {
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "max_pool2d", [&] {
    max_pool(x.data<T>(), x.size(0) * x.size(1), x.size(2), x.size(3), y.size(2), y.size(3), g,
             relu, y.data<T>(), argmax.data<int32_t>(), stream_of(x));
  });
}

void CudaBackend::max_pool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "max_pool2d_backward", [&] {
    max_pool_backward(dy.data<T>(), argmax.data<int32_t>(), dx.size(0) * dx.size(1),
                      dx.size(2) * dx.size(3), dy.size(2) * dy.size(3), dx.data<T>(),
                      stream_of(dy));
  });
}

void CudaBackend::avg_pool2d(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "avg_pool2d", [&] {
    avg_pool(x.data<T>(), x.size(0) * x.size(1), x.size(2), x.size(3), y.size(2), y.size(3), g,
             y.data<T>(), stream_of(x));
  });
}

void CudaBackend::avg_pool2d_backward(const Tensor& dy, const Pool2dGeometry& g, Tensor& dx) {
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "avg_pool2d_backward", [&] {
    avg_pool_backward(dy.data<T>(), dx.size(0) * dx.size(1), dx.size(2), dx.size(3), dy.size(2),
                      dy.size(3), g, dx.data<T>(), stream_of(dy));
  });
}

}  // namespace accrue::cuda
