// CPU optimizer-step primitives: the boundary scalars and the fused Adam / SGD passes. Each pass
// reads and writes every arena element once: the gradient is scaled (normalisation and clip),
// used, and zeroed in the same loop, so no separate zero_grad pass exists.
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

namespace {

// Runs update(coef, i) over every element, or only zeroes g when the step is skipped.
// boundary [4] = {norm, coef, skip, scale}.
template <typename T, typename F>
void fused_pass(const Tensor& boundary, Tensor& grad, F update) {
  const T* s = boundary.data<T>();  // {norm, coef, skip, scale}
  T* g = grad.data<T>();
  const int64_t n = grad.numel();
  if (s[2] != T(0)) {
    for_each(n, [=](int64_t i) { g[i] = T(0); });
    return;
  }
  const T coef = s[1];
  for_each(n, [&](int64_t i) { update(coef, i); });
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

void CpuBackend::adam_step(const AdamParams& hp, const Tensor& boundary, const Tensor& steps,
                           Tensor& param, Tensor& grad, Tensor& m, Tensor& v, Tensor& working) {
  const fn::AdamUpdate update = fn::AdamUpdate::at_step(hp, steps.data<int32_t>()[0]);
  ACCRUE_DISPATCH_FLOATING(param.dtype(), "adam_step", [&] {
    T* p = param.data<T>();
    T* g = grad.data<T>();
    T* pm = m.data<T>();
    T* pv = v.data<T>();
    with_working_copy(working, "adam_step", [&](auto* w) {
      fused_pass<T>(boundary, grad, [&](T coef, int64_t i) {
        update(coef, p[i], g[i], pm[i], pv[i]);
        fn::write_working(w, i, p[i]);
      });
    });
  });
}

void CpuBackend::sgd_step(const SgdParams& hp, const Tensor& boundary, const Tensor& steps,
                          Tensor& param, Tensor& grad, Tensor& momentum, Tensor& working) {
  const fn::SgdUpdate update = fn::SgdUpdate::at_step(hp, steps.data<int32_t>()[0]);
  ACCRUE_DISPATCH_FLOATING(param.dtype(), "sgd_step", [&] {
    T* p = param.data<T>();
    T* g = grad.data<T>();
    T* buf = momentum.data<T>();
    with_working_copy(working, "sgd_step", [&](auto* w) {
      fused_pass<T>(boundary, grad, [&](T coef, int64_t i) {
        update(coef, p[i], g[i], buf[i]);
        fn::write_working(w, i, p[i]);
      });
    });
  });
}

}  // namespace accrue::cpu
