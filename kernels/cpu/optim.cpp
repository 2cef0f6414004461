// CPU optimizer-step primitives: the boundary scalars and the fused Adam / SGD passes. Each pass
// reads and writes every arena element once: the gradient is scaled (normalisation and clip),
// used, and zeroed in the same loop, so no separate zero_grad pass exists. With a 16-bit working
// copy (mixed precision) each chunk of parameters just updated is rounded into it while it is
// still in cache: the same single pass over memory.
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

namespace {

// Elements per chunk of the fused pass: the chunk's parameters are still in L1 when the working
// copy is written.
constexpr int64_t kChunk = 2048;

// w [begin, end) = p [begin, end) rounded (nothing without a working copy).
template <typename W, typename T>
void write_working_range(W* w, const T* p, int64_t begin, int64_t end) {
  if constexpr (!std::is_same_v<W, fn::NoWorkingCopy>) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) w[i] = store<W>(p[i]);
  }
}

// Runs update(coef, i) over every element, chunk by chunk, then rounds the chunk's parameters p
// into the working copy w; or only zeroes g when the step is skipped (w keeps its values).
// boundary [4] = {norm, coef, skip, scale}.
template <typename T, typename W, typename F>
void fused_pass(const Tensor& boundary, Tensor& grad, const T* p, W* w, F update) {
  const T* s = boundary.data<T>();
  T* g = grad.data<T>();
  const int64_t n = grad.numel();
  if (s[2] != T(0)) {
    for_each(n, [=](int64_t i) { g[i] = T(0); });
    return;
  }
  const T coef = s[1];
  for_chunks(n, kChunk, [&](int64_t, int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) update(coef, i);
    write_working_range(w, p, begin, end);
  });
}

}  // namespace

void CpuBackend::boundary(const Tensor& norm_sq, double normalize, double max_norm,
                          const LossScaling& scaling, Tensor& scaler, Tensor& out, Tensor& steps) {
  ACCRUE_DISPATCH_FLOATING(norm_sq.dtype(), "boundary", [&] {
    const T* in = norm_sq.data<T>();
    fn::boundary_scalars<T>(in[0], in[1], normalize, max_norm, scaling,
                            scaler.defined() ? scaler.data<T>() : nullptr, out.data<T>(),
                            steps.data<int32_t>());
  });
}

void CpuBackend::adam_step(const AdamArgs& hp, const Tensor& boundary, const Tensor& steps,
                           Tensor& param, Tensor& grad, Tensor& m, Tensor& v, Tensor& working) {
  const fn::AdamUpdate update = fn::AdamUpdate::at_step(hp, steps.data<int32_t>()[0]);
  ACCRUE_DISPATCH_FLOATING(param.dtype(), "adam_step", [&] {
    T* p = param.data<T>();
    T* g = grad.data<T>();
    T* pm = m.data<T>();
    T* pv = v.data<T>();
    with_working_copy(working, "adam_step", [&](auto* w) {
      fused_pass(boundary, grad, p, w,
                 [&](T coef, int64_t i) { update(coef, p[i], g[i], pm[i], pv[i]); });
    });
  });
}

void CpuBackend::sgd_step(const SgdArgs& hp, const Tensor& boundary, const Tensor& steps,
                          Tensor& param, Tensor& grad, Tensor& momentum, Tensor& working) {
  const fn::SgdUpdate update = fn::SgdUpdate::at_step(hp, steps.data<int32_t>()[0]);
  ACCRUE_DISPATCH_FLOATING(param.dtype(), "sgd_step", [&] {
    T* p = param.data<T>();
    T* g = grad.data<T>();
    T* buf = momentum.data<T>();
    with_working_copy(working, "sgd_step", [&](auto* w) {
      fused_pass(boundary, grad, p, w,
                 [&](T coef, int64_t i) { update(coef, p[i], g[i], buf[i]); });
    });
  });
}

}  // namespace accrue::cpu
