// CUDA pooling, NCHW: one thread per output element for the forward passes and for average
// pooling's backward (each input element gathers the pooling regions that cover it: no atomics, a
// fixed order); max pooling's backward scatters dy at the saved argmax, skipping -1
// (max_pool2d_relu's argmax where the pooled relu(x) is not positive): a block per plane in shared
// memory, the outputs side by side where no two pick the same input, else in order.
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

// A plane's dx and, per input, the first output that picks it, in shared memory: planes up to
// this many bytes (the dynamic shared memory every device gives a block without opting in).
constexpr int64_t kPlaneSharedBytes = 48 * 1024;

// One block per plane: dx [area] = +0 in shared memory; each input records the first output that
// picks it (atomicMin: the same whatever the threads' order); where every routed output is its
// input's first (no two pick one input: the CNN's 2 x 2 regions at stride 2), the outputs write
// 0 + dy side by side, else one thread adds them in output order; the plane is then written out
// whole. Either way each input's value is the in-order loop's (below), bit for bit. An argmax
// outside [0, area) routes nowhere.
template <typename T>
__global__ void max_pool_backward_in_shared(const T* dy, const int32_t* at, int64_t area,
                                            int64_t outputs, T* dx) {
  extern __shared__ __align__(16) unsigned char shared[];
  T* plane = reinterpret_cast<T*>(shared);
  int32_t* first = reinterpret_cast<int32_t*>(plane + area);
  const T* grad = dy + blockIdx.x * outputs;
  const int32_t* target = at + blockIdx.x * outputs;
  const auto routed = [&](int64_t o) { return target[o] >= 0 && target[o] < area; };
  for (int64_t i = threadIdx.x; i < area; i += blockDim.x) {
    plane[i] = T(0);
    first[i] = INT32_MAX;
  }
  __syncthreads();
  for (int64_t o = threadIdx.x; o < outputs; o += blockDim.x) {
    if (routed(o)) atomicMin(&first[target[o]], static_cast<int32_t>(o));
  }
  __syncthreads();
  int shares = 0;
  for (int64_t o = threadIdx.x; o < outputs; o += blockDim.x) {
    shares |= routed(o) && first[target[o]] != static_cast<int32_t>(o);
  }
  if (__syncthreads_or(shares)) {
    if (threadIdx.x == 0) {
      for (int64_t o = 0; o < outputs; ++o) {
        if (routed(o)) plane[target[o]] += grad[o];
      }
    }
  } else {
    for (int64_t o = threadIdx.x; o < outputs; o += blockDim.x) {
      if (routed(o)) plane[target[o]] += grad[o];  // onto +0, the only add this input takes
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < area; i += blockDim.x) dx[blockIdx.x * area + i] = plane[i];
}

// dy [planes, outputs], argmax -> dx [planes, area] = +0, then each plane's outputs added in
// order, so an input that several windows pick sums them in a fixed order: in shared memory where
// the plane fits (above), else dx zeroed by one coalesced memset and one thread a plane.
template <typename T>
void max_pool_backward(const T* dy, const int32_t* at, int64_t planes, int64_t area,
                       int64_t outputs, T* dx, cudaStream_t stream) {
  if (planes * area == 0) return;  // an empty dx has no memory to zero (its pointer is null)
  const int64_t shared_bytes = area * int64_t(sizeof(T) + sizeof(int32_t));
  if (shared_bytes <= kPlaneSharedBytes && planes <= INT32_MAX) {
    max_pool_backward_in_shared<<<static_cast<unsigned>(planes), kThreads, size_t(shared_bytes),
                                  stream>>>(dy, at, area, outputs, dx);
    ACCRUE_CUDA_LAUNCH_CHECK();
    return;
  }
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(dx, 0, size_t(planes * area) * sizeof(T), stream));
  for_each(planes, stream, [=] __device__(int64_t p) {
    T* plane = dx + p * area;
    for (int64_t o = 0; o < outputs; ++o) {
      const int32_t i = at[p * outputs + o];
      if (i >= 0 && i < area) plane[i] += dy[p * outputs + o];
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
