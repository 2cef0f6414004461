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

namespace {

// out [n] = in [n] masked and scaled, the elements being first .. first + n - 1 of the row whose
// key is `row`, with the threshold computed once: the mask in integers only, so the hash
// vectorises.
template <typename T>
void dropout_run(const fn::DropoutMask& mask, const T* in, T* out, int64_t n, uint64_t row,
                 uint64_t first, uint64_t threshold) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = mask.apply_in_row(in[j], row, first + j, threshold);
}

}  // namespace

void CpuBackend::dropout(const Tensor& x, const DropoutKey& key, const Tensor& samples, Tensor& y) {
  // x [N, D...] -> y, row r keyed by samples[r]
  const int64_t rows = x.size(0), per_row = rows ? x.numel() / rows : 0;
  const fn::DropoutMask mask{key.seed, static_cast<uint64_t>(key.step), key.p, 1.0 / (1.0 - key.p)};
  const uint64_t threshold = mask.keep_threshold();
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "dropout", [&] {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const int32_t* sample = samples.data<int32_t>();
    // Fixed chunks of the flat index; within a chunk, runs of one row each, the row's part of
    // the hash computed once per run.
    for_chunks(x.numel(), kDropoutChunk, [=](int64_t, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end;) {
        const int64_t r = i / per_row, run_end = std::min(end, (r + 1) * per_row);
        dropout_run(mask, in + i, out + i, run_end - i,
                    mask.row_key(static_cast<uint64_t>(sample[r])),
                    static_cast<uint64_t>(i - r * per_row), threshold);
        i = run_end;
      }
    });
  });
}

}  // namespace accrue::cpu
