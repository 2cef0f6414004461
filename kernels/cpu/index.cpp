// CPU indexing: gathering rows by an index (micro-batches from a shuffled dataset).
#include <cstring>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"

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

}  // namespace accrue::cpu
