// CUDA optimizer-step primitives: the boundary scalars (one thread) and the fused Adam / SGD
// passes. Each pass reads the clip coefficient, the skip flag and the step count from device
// memory, so the whole boundary step is enqueued without a host synchronisation. Per element,
// Adam reads p, g, m, v and writes p, g (zeroed), m, v: 32 bytes in float32, with float4 loads.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cuda {

namespace {

// p, g, m, v [n], w [n] (or no working copy); boundary [4] {norm, coef, skip, scale}; steps [1]
template <typename T, typename W>
__global__ void adam_kernel(AdamArgs hp, const T* boundary, const int32_t* steps, T* p, T* g, T* m,
                            T* v, W* w, int64_t n) {
  __shared__ fn::AdamUpdate update;
  if (threadIdx.x == 0) update = fn::AdamUpdate::at_step(hp, steps[0]);
  __syncthreads();
  const bool skip = boundary[2] != T(0);
  const T coef = boundary[1];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if constexpr (std::is_same_v<T, float>) {
    // 128-bit path over the aligned bulk; the arena is 64-byte aligned and padded to 16 elements.
    const int64_t n4 = (aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v)) ? n / 4 : 0;
    for (int64_t j = i; j < n4; j += stride) {
      float4 pp = reinterpret_cast<float4*>(p)[j], gg = reinterpret_cast<float4*>(g)[j];
      float4 mm = reinterpret_cast<float4*>(m)[j], vv = reinterpret_cast<float4*>(v)[j];
      if (!skip) {
        update(coef, pp.x, gg.x, mm.x, vv.x);
        update(coef, pp.y, gg.y, mm.y, vv.y);
        update(coef, pp.z, gg.z, mm.z, vv.z);
        update(coef, pp.w, gg.w, mm.w, vv.w);
        reinterpret_cast<float4*>(p)[j] = pp;
        reinterpret_cast<float4*>(m)[j] = mm;
        reinterpret_cast<float4*>(v)[j] = vv;
        fn::write_working(w, 4 * j, pp.x);
        fn::write_working(w, 4 * j + 1, pp.y);
        fn::write_working(w, 4 * j + 2, pp.z);
        fn::write_working(w, 4 * j + 3, pp.w);
      }
      reinterpret_cast<float4*>(g)[j] = make_float4(0, 0, 0, 0);
    }
    i += n4 * 4;
  }
  for (; i < n; i += stride) {
    if (skip) {
      g[i] = T(0);
    } else {
      update(coef, p[i], g[i], m[i], v[i]);
      fn::write_working(w, i, p[i]);
    }
  }
}

// p, g, buf [n], w [n] (or no working copy); boundary [4]; steps [1]
template <typename T, typename W>
__global__ void sgd_kernel(SgdArgs hp, const T* boundary, const int32_t* steps, T* p, T* g, T* buf,
                           W* w, int64_t n) {
  const fn::SgdUpdate update = fn::SgdUpdate::at_step(hp, steps[0]);
  const bool skip = boundary[2] != T(0);
  const T coef = boundary[1];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (skip) {
      g[i] = T(0);
    } else {
      update(coef, p[i], g[i], buf[i]);
      fn::write_working(w, i, p[i]);
    }
  }
}

}  // namespace

void CudaBackend::boundary(const Tensor& norm_sq, double normalize, double max_norm,
                           const LossScaling& scaling, Tensor& scaler, Tensor& out, Tensor& steps) {
  ACCRUE_DISPATCH_FLOATING(norm_sq.dtype(), "boundary", [&] {
    const T* in = norm_sq.data<T>();
    T* sc = scaler.defined() ? scaler.data<T>() : nullptr;
    T* o = out.data<T>();
    int32_t* st = steps.data<int32_t>();
    // A fault recorded by a kernel of this window (a bad device-resident index or label) counts
    // as a non-finite gradient: the update is skipped before the host hears of it.
    const DeviceFault* fault = context(out.device().index).fault;
    for_each(1, stream_of(out), [=] __device__(int64_t) {
      const T nonfinite = in[1] + (fault->op != kNoFault ? T(1) : T(0));
      fn::boundary_scalars<T>(in[0], nonfinite, normalize, max_norm, scaling, sc, o, st);
    });
  });
}

void CudaBackend::adam_step(const AdamArgs& hp, const Tensor& boundary, const Tensor& steps,
                            Tensor& param, Tensor& grad, Tensor& m, Tensor& v, Tensor& working) {
  ACCRUE_DISPATCH_FLOATING(param.dtype(), "adam_step", [&] {
    const int64_t n = param.numel();
    with_working_copy(working, "adam_step", [&](auto* w) {
      adam_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream_of(param)>>>(
          hp, boundary.data<T>(), steps.data<int32_t>(), param.data<T>(), grad.data<T>(),
          m.data<T>(), v.data<T>(), w, n);
      ACCRUE_CUDA_LAUNCH_CHECK();
    });
  });
}

void CudaBackend::sgd_step(const SgdArgs& hp, const Tensor& boundary, const Tensor& steps,
                           Tensor& param, Tensor& grad, Tensor& momentum, Tensor& working) {
  ACCRUE_DISPATCH_FLOATING(param.dtype(), "sgd_step", [&] {
    const int64_t n = param.numel();
    with_working_copy(working, "sgd_step", [&](auto* w) {
      sgd_kernel<<<blocks_for(n), kThreads, 0, stream_of(param)>>>(
          hp, boundary.data<T>(), steps.data<int32_t>(), param.data<T>(), grad.data<T>(),
          momentum.data<T>(), w, n);
      ACCRUE_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace accrue::cuda
