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
               [=] __device__(int64_t i) { d[i] = static_cast<D>(load(s[i])); });
    });
  });
}

namespace {

// The visitors of kernels/functors.h, as structs: nvcc takes no device lambdas inside the
// generic lambdas the CPU backend uses here.
template <typename T>
struct LaunchUnary {  // x [n] -> y [n]
  int64_t n;
  const T* x;
  T* y;
  cudaStream_t stream;
  template <typename F>
  void operator()(F f) const {
    map1(n, x, y, f, stream);
  }
};

template <typename T>
struct LaunchBinary {  // a [n], b [n] -> out [n]
  int64_t n;
  const T* a;
  const T* b;
  T* out;
  cudaStream_t stream;
  template <typename F>
  void operator()(F f) const {
    map2(n, a, b, out, f, stream);
  }
};

template <typename T>
struct LaunchUnaryBackward {  // saved [n], dy [n] -> dx [n]: the op's backward functor, binary
  LaunchBinary<T> launch;
  template <typename F>
  void operator()(F) const {
    launch(typename F::Backward{});
  }
};

}  // namespace

void CudaBackend::unary(UnaryOp op, const Tensor& x, Tensor& y) {
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), op_name(op), [&] {
    visit(op, LaunchUnary<T>{x.numel(), x.data<T>(), y.data<T>(), stream_of(x)});
  });
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& saved, const Tensor& dy, Tensor& dx) {
  ACCRUE_DISPATCH_FLOATING_AND_HALF(dy.dtype(), op_name(op), [&] {
    visit(op, LaunchUnaryBackward<T>{
                  {dy.numel(), saved.data<T>(), dy.data<T>(), dx.data<T>(), stream_of(dy)}});
  });
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  ACCRUE_DISPATCH_FLOATING_AND_HALF(a.dtype(), op_name(op), [&] {
    visit(op, LaunchBinary<T>{a.numel(), a.data<T>(), b.data<T>(), out.data<T>(), stream_of(a)});
  });
}

void CudaBackend::scale(double alpha, const Tensor& x, Tensor& y) {
  // x [n] -> y [n] = alpha * x
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "scale", [&] {
    map1(x.numel(), x.data<T>(), y.data<T>(), fn::Scale{alpha}, stream_of(x));
  });
}

void CudaBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  // y [n] += alpha * x [n]; y may be float32 under a 16-bit x (a gradient into the arena)
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "axpy", [&] {
    with_wide_output<T>(y, "axpy", [&](auto* out) {
      map2(x.numel(), x.data<T>(), out, out, fn::Axpy{alpha}, stream_of(y));
    });
  });
}

void CudaBackend::bias_add(const Tensor& x, const Tensor& b, Tensor& y) {
  // x [N, C] + b [C] -> y [N, C]; y may alias x
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "bias_add", [&] {
    const T* in = x.data<T>();
    const T* bias = b.data<T>();
    T* out = y.data<T>();
    const int64_t cols = x.size(1);
    for_each(x.numel(), stream_of(x),
             [=] __device__(int64_t i) { out[i] = store<T>(load(in[i]) + load(bias[i % cols])); });
  });
}

void CudaBackend::expand_scalar(const Tensor& s, double alpha, Tensor& out) {
  // s [1] -> out [n] = alpha * s[0]
  ACCRUE_DISPATCH_FLOATING_AND_HALF(out.dtype(), "expand_scalar", [&] {
    const T* in = s.data<T>();
    T* o = out.data<T>();
    for_each(out.numel(), stream_of(out),
             [=] __device__(int64_t i) { o[i] = store<T>(compute_t<T>(alpha) * load(in[0])); });
  });
}

}  // namespace accrue::cuda
