// CPU dropout: the counter-based mask of kernels/functors.h (fn::DropoutMask), keyed by the
// row's sample index and the element's index in the row, so the mask never depends on how
// samples were grouped into micro-batches; the backward is the same call on dy.
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

void CpuBackend::dropout(const Tensor& x, const DropoutKey& key, const Tensor& samples, Tensor& y) {
  // x [N, D...] -> y, row r keyed by samples[r]
  const int64_t rows = x.size(0), per_row = rows ? x.numel() / rows : 0;
  const fn::DropoutMask mask{key.seed, static_cast<uint64_t>(key.step), key.p, 1.0 / (1.0 - key.p)};
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "dropout", [&] {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const int32_t* sample = samples.data<int32_t>();
    for_each(x.numel(), [=](int64_t i) {
      const int64_t r = i / per_row;
      out[i] =
          mask(in[i], static_cast<uint64_t>(sample[r]), static_cast<uint64_t>(i - r * per_row));
    });
  });
}

}  // namespace accrue::cpu
