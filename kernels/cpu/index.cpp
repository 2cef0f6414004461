// CPU indexing: gathering rows by an index (micro-batches from a shuffled dataset, an
// embedding's lookup) and its backward, adding rows back by the index (an embedding's gradient).
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"

namespace accrue::cpu {

void CpuBackend::gather_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  // src [N, D], index [M] -> out [M, D], rows copied whole
  const int64_t rows = index.numel();
  const size_t row_bytes = src.size(0) ? src.nbytes() / static_cast<size_t>(src.size(0)) : 0;
  const int32_t* idx = index.data<int32_t>();
  const char* in = static_cast<const char*>(src.raw());
  char* o = static_cast<char*>(out.raw());
  // Work in 4-byte words, the unit the other loops count in elements.
  for_range(rows, rows * int64_t(row_bytes) / 4,
            [=](int64_t m) { std::memcpy(o + m * row_bytes, in + idx[m] * row_bytes, row_bytes); });
}

void CpuBackend::index_add_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  // src [N, D], index [N] -> out [V, D] += src[n] at row index[n]. The positions are bucketed by
  // their row (a stable counting sort), then the rows are summed in parallel, each over its
  // positions in increasing n: the same bits for any number of threads.
  ACCRUE_DISPATCH_FLOATING(src.dtype(), "index_add_rows", [&] {
    const int64_t n = index.numel(), rows = out.size(0);
    const int64_t d = n ? src.numel() / n : 0;
    const int32_t* idx = index.data<int32_t>();
    std::vector<int64_t> start(static_cast<size_t>(rows + 1), 0), order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ++start[static_cast<size_t>(idx[i]) + 1];
    for (int64_t r = 0; r < rows; ++r) start[r + 1] += start[r];
    std::vector<int64_t> cursor(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(cursor[idx[i]]++)] = i;
    const T* in = src.data<T>();
    T* o = out.data<T>();
    const int64_t* first = start.data();
    const int64_t* pos = order.data();
    for_range(rows, n * d, [=](int64_t r) {
      if (first[r] == first[r + 1]) return;
      for (int64_t c = 0; c < d; ++c) {  // as the CUDA kernel: the run's sum, then one add
        T total = 0;
        for (int64_t j = first[r]; j < first[r + 1]; ++j) total += in[pos[j] * d + c];
        o[r * d + c] += total;
      }
    });
  });
}

}  // namespace accrue::cpu
