// CPU dropout: the counter-based mask of kernels/functors.h (fn::DropoutMask), keyed by the
// row's sample index and the element's index in the row, so the mask never depends on how
// samples were grouped into micro-batches; the backward is the same call on dy.
#include <algorithm>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

constexpr int64_t kDropoutChunk = 1 << 14;  // elements per task of the team

void CpuBackend::dropout(const Tensor& x, const DropoutKey& key, const Tensor& samples, Tensor& y) {
  // x [N, D...] -> y, row r keyed by samples[r]
  const int64_t rows = x.size(0), per_row = rows ? x.numel() / rows : 0;
  const fn::DropoutMask mask{key.seed, static_cast<uint64_t>(key.step), key.p, 1.0 / (1.0 - key.p)};
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "dropout", [&] {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const int32_t* sample = samples.data<int32_t>();
    const T scale = T(mask.scale);
    // Fixed chunks of the flat index; within a chunk, runs of one row each, the row's part of
    // the hash computed once (the per-element division and three of the four mixes gone).
    for_chunks(x.numel(), kDropoutChunk, [=](int64_t, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end;) {
        const int64_t r = i / per_row, run_end = std::min(end, (r + 1) * per_row);
        const uint64_t row = mask.row_key(static_cast<uint64_t>(sample[r]));
        for (; i < run_end; ++i) {
          // mask.apply_in_row as an indexed pick: a ternary compiled to a branch on a coin flip
          const T picks[2] = {T(0), in[i] * scale};
          out[i] = picks[mask.keep_in_row(row, static_cast<uint64_t>(i - r * per_row))];
        }
      }
    });
  });
}

}  // namespace accrue::cpu
