// CPU element-wise primitives: fills, copies, casts, the functors of kernels/functors.h, the
// accumulation axpy and the row-broadcast bias add.
#include <cstring>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

void CpuBackend::fill(Tensor& out, double value) {
  dispatch_all(out.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    T* p = out.data<T>();
    const T v = static_cast<T>(value);
    const int64_t n = out.numel();
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  });
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  if (src.nbytes() > 0 && src.raw() != dst.raw()) std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

void CpuBackend::cast(const Tensor& src, Tensor& dst) {
  dispatch_all(src.dtype(), "cast", [&](auto stag) {
    using S = decltype(stag);
    dispatch_all(dst.dtype(), "cast", [&](auto dtag) {
      using D = decltype(dtag);
      const S* s = src.data<S>();
      D* d = dst.data<D>();
      for (int64_t i = 0; i < src.numel(); ++i) d[i] = static_cast<D>(s[i]);
    });
  });
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, Tensor& y) {
  dispatch_floating(x.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    visit(op, [&](auto f) { map(x.numel(), x.data<T>(), y.data<T>(), f); });
  });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& saved, const Tensor& dy, Tensor& dx) {
  dispatch_floating(dy.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    visit(op, [&](auto f) {
      using Backward = typename decltype(f)::Backward;
      map2(dy.numel(), saved.data<T>(), dy.data<T>(), dx.data<T>(), Backward{});
    });
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_floating(a.dtype(), op_name(op), [&](auto tag) {
    using T = decltype(tag);
    visit(op, [&](auto f) { map2(a.numel(), a.data<T>(), b.data<T>(), out.data<T>(), f); });
  });
}

void CpuBackend::scale(double alpha, const Tensor& x, Tensor& y) {
  dispatch_floating(x.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    map(x.numel(), x.data<T>(), y.data<T>(), fn::Scale{alpha});
  });
}

void CpuBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  dispatch_floating(x.dtype(), "axpy", [&](auto tag) {
    using T = decltype(tag);
    map2(x.numel(), x.data<T>(), y.data<T>(), y.data<T>(), fn::Axpy{alpha});
  });
}

void CpuBackend::bias_add(const Tensor& x, const Tensor& b, Tensor& y) {
  // x [N, C] + b [C] -> y [N, C]; y may alias x.
  dispatch_floating(x.dtype(), "bias_add", [&](auto tag) {
    using T = decltype(tag);
    const int64_t rows = x.size(0), cols = x.size(1);
    const T* in = x.data<T>();
    const T* bias = b.data<T>();
    T* out = y.data<T>();
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = in[r * cols + c] + bias[c];
    }
  });
}

void CpuBackend::expand_scalar(const Tensor& s, double alpha, Tensor& out) {
  dispatch_floating(out.dtype(), "expand_scalar", [&](auto tag) {
    using T = decltype(tag);
    fill(out, static_cast<double>(s.data<T>()[0]) * alpha);
  });
}

}  // namespace accrue::cpu
