// CPU element-wise primitives: fills, copies, casts, the functors of kernels/functors.h, the
// accumulation axpy and the row-broadcast bias add.
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half_lanes_probe.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/row_probe.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/vec.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

void CpuBackend::fill(Tensor& out, double value) {
  ACCRUE_DISPATCH_ALL(out.dtype(), "fill", [&] {
    T* p = out.data<T>();
    const T v = static_cast<T>(value);
    for_each(out.numel(), [=](int64_t i) { p[i] = v; });
  });
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  if (src.nbytes() > 0 && src.raw() != dst.raw()) std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

void CpuBackend::cast(const Tensor& src, Tensor& dst) {
  ACCRUE_DISPATCH_ALL_AS(S, src.dtype(), "cast", [&] {
    ACCRUE_DISPATCH_ALL_AS(D, dst.dtype(), "cast", [&] {
      const S* s = src.data<S>();
      D* d = dst.data<D>();
      for_each(src.numel(), [=](int64_t i) { d[i] = static_cast<D>(load(s[i])); });
    });
  });
}

Tensor in_compute_dtype(Backend& be, const Tensor& t) {
  if (!t.defined() || t.dtype() == compute_dtype(t.dtype())) return t;
  Tensor wide = Tensor::empty(t.shape(), compute_dtype(t.dtype()), t.device());
  be.cast(t, wide);
  return wide;
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, Tensor& y) {
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), op_name(op), [&] {
    visit(op, [&](auto f) { map1(x.numel(), x.data<T>(), y.data<T>(), f); });
  });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& saved, const Tensor& dy, Tensor& dx) {
  ACCRUE_DISPATCH_FLOATING_AND_HALF(dy.dtype(), op_name(op), [&] {
    visit(op, [&](auto f) {
      using Backward = typename decltype(f)::Backward;
      map2(dy.numel(), saved.data<T>(), dy.data<T>(), dx.data<T>(), Backward{});
    });
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  ACCRUE_DISPATCH_FLOATING_AND_HALF(a.dtype(), op_name(op), [&] {
    visit(op, [&](auto f) { map2(a.numel(), a.data<T>(), b.data<T>(), out.data<T>(), f); });
  });
}

void CpuBackend::scale(double alpha, const Tensor& x, Tensor& y) {
  ACCRUE_DISPATCH_FLOATING_AND_HALF(
      x.dtype(), "scale", [&] { map1(x.numel(), x.data<T>(), y.data<T>(), fn::Scale{alpha}); });
}

void CpuBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  // y may be float32 under a 16-bit x: a gradient added into the float32 arena.
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "axpy", [&] {
    with_wide_output<T>(
        y, "axpy", [&](auto* out) { map2(x.numel(), x.data<T>(), out, out, fn::Axpy{alpha}); });
  });
}

void CpuBackend::bias_add(const Tensor& x, const Tensor& b, Tensor& y) {
  // x [N, C] + b [C] -> y [N, C]; y may alias x.
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "bias_add", [&] {
    const int64_t rows = x.size(0), cols = x.size(1);
    const T* in = x.data<T>();
    const T* bias = b.data<T>();
    T* out = y.data<T>();
    for_rows(rows, cols, [=](int64_t r) { add_row(in + r * cols, bias, out + r * cols, cols); });
  });
}

void CpuBackend::expand_scalar(const Tensor& s, double alpha, Tensor& out) {
  ACCRUE_DISPATCH_FLOATING_AND_HALF(out.dtype(), "expand_scalar", [&] {
    fill(out, static_cast<double>(load(s.data<T>()[0])) * alpha);
  });
}

namespace {
constexpr int64_t kHalfLanes = 16;
template <typename H>
void widen_lanes_of(const H* in, int64_t n, float* out) {
  for (int64_t i = 0; i + kHalfLanes <= n; i += kHalfLanes) {
    vec::store(out + i, vec::load_widened<H, kHalfLanes>(in + i));
  }
}
template <typename H>
void round_lanes_of(const float* in, int64_t n, H* out) {
  for (int64_t i = 0; i + kHalfLanes <= n; i += kHalfLanes) {
    vec::store_rounded(out + i, vec::load<float, kHalfLanes>(in + i));
  }
}
}  // namespace

void widen_lanes(const bf16* in, int64_t n, float* out) {
  widen_lanes_of(in, n, out);
}
void widen_lanes(const f16* in, int64_t n, float* out) {
  widen_lanes_of(in, n, out);
}
void round_lanes(const float* in, int64_t n, bf16* out) {
  round_lanes_of(in, n, out);
}
void round_lanes(const float* in, int64_t n, f16* out) {
  round_lanes_of(in, n, out);
}

void copy_row_as_built(const void* src, int64_t n, int64_t element_bytes, void* dst) {
  const auto copy = [&](auto zero) {
    using T = decltype(zero);
    vec::copy_row(static_cast<const T*>(src), n, static_cast<T*>(dst));
  };
  if (element_bytes == 2) return copy(bf16{});
  if (element_bytes == 4) return copy(float{});
  if (element_bytes == 8) return copy(double{});
  throw std::invalid_argument(
      str_cat("[copy_row] elements of 2, 4 or 8 bytes, got ", element_bytes));
}

void add_row_as_built(const float* src, int64_t n, float* out) {
  vec::add_row(src, n, out);
}
void add_row_as_built(const double* src, int64_t n, double* out) {
  vec::add_row(src, n, out);
}

}  // namespace accrue::cpu
