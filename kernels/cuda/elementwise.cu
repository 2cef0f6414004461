// CUDA element-wise primitives: fills, copies, casts, the functors of kernels/functors.h, the
// accumulation axpy and the row-broadcast bias add. Each is one grid-stride launch.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cuda {

void CudaBackend::fill(Tensor& out, double value) {
  ACCRUE_DISPATCH_ALL(out.dtype(), "fill", [&] {
    T* p = out.data<T>();
    const T v = static_cast<T>(value);
    for_each(out.numel(), stream_of(out), [=] __device__(int64_t i) { p[i] = v; });
  });
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  if (src.nbytes() == 0 || src.raw() == dst.raw()) return;
  ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice,
                                    stream_of(dst)));
}

void CudaBackend::cast(const Tensor& src, Tensor& dst) {
  ACCRUE_DISPATCH_ALL_AS(S, src.dtype(), "cast", [&] {
    ACCRUE_DISPATCH_ALL_AS(D, dst.dtype(), "cast", [&] {
      const S* s = src.data<S>();
      D* d = dst.data<D>();
      for_each(src.numel(), stream_of(dst),
               [=] __device__(int64_t i) { d[i] = static_cast<D>(s[i]); });
    });
  });
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, double alpha, Tensor& y) {
  // x [n] -> y [n]
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "unary", [&] {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const int64_t n = x.numel();
    cudaStream_t s = stream_of(x);
    switch (op) {
      case UnaryOp::kRelu:
        map1(n, in, out, fn::Relu{}, s);
        break;
      case UnaryOp::kTanh:
        map1(n, in, out, fn::Tanh{}, s);
        break;
      case UnaryOp::kGelu:
        map1(n, in, out, fn::Gelu{}, s);
        break;
      case UnaryOp::kScale:
        map1(n, in, out, fn::Scale{alpha}, s);
        break;
    }
  });
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& saved, const Tensor& dy, Tensor& dx) {
  // saved [n] (x or y), dy [n] -> dx [n]
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "unary_backward", [&] {
    const T* sv = saved.data<T>();
    const T* g = dy.data<T>();
    T* out = dx.data<T>();
    const int64_t n = dy.numel();
    cudaStream_t s = stream_of(dy);
    switch (op) {
      case UnaryOp::kRelu:
        map2(n, sv, g, out, fn::ReluBackward{}, s);
        break;
      case UnaryOp::kTanh:
        map2(n, sv, g, out, fn::TanhBackward{}, s);
        break;
      case UnaryOp::kGelu:
        map2(n, sv, g, out, fn::GeluBackward{}, s);
        break;
      case UnaryOp::kScale:
        throw std::logic_error("[scale] backward is a forward scale");
    }
  });
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  // a [n], b [n] -> out [n]
  ACCRUE_DISPATCH_FLOATING(a.dtype(), "binary", [&] {
    const int64_t n = a.numel();
    cudaStream_t s = stream_of(a);
    switch (op) {
      case BinaryOp::kAdd:
        map2(n, a.data<T>(), b.data<T>(), out.data<T>(), fn::Add{}, s);
        break;
      case BinaryOp::kSub:
        map2(n, a.data<T>(), b.data<T>(), out.data<T>(), fn::Sub{}, s);
        break;
      case BinaryOp::kMul:
        map2(n, a.data<T>(), b.data<T>(), out.data<T>(), fn::Mul{}, s);
        break;
    }
  });
}

void CudaBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  // y [n] += alpha * x [n]
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "axpy", [&] {
    map2(x.numel(), x.data<T>(), y.data<T>(), y.data<T>(), fn::Axpy{alpha}, stream_of(y));
  });
}

void CudaBackend::bias_add(const Tensor& x, const Tensor& b, Tensor& y) {
  // x [N, C] + b [C] -> y [N, C]; y may alias x
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "bias_add", [&] {
    const T* in = x.data<T>();
    const T* bias = b.data<T>();
    T* out = y.data<T>();
    const int64_t cols = x.size(1);
    for_each(x.numel(), stream_of(x),
             [=] __device__(int64_t i) { out[i] = in[i] + bias[i % cols]; });
  });
}

void CudaBackend::expand_scalar(const Tensor& s, double alpha, Tensor& out) {
  // s [1] -> out [n] = alpha * s[0]
  ACCRUE_DISPATCH_FLOATING(out.dtype(), "expand_scalar", [&] {
    const T* in = s.data<T>();
    T* o = out.data<T>();
    for_each(out.numel(), stream_of(out), [=] __device__(int64_t i) { o[i] = T(alpha) * in[0]; });
  });
}

}  // namespace accrue::cuda
