// Per-thread scratch for CPU kernels that share work out over the OpenMP team: one [rows, cols]
// buffer of T per thread, taken from the caching allocator (so it counts as activation memory and
// is reused across calls instead of allocated per row or sample).
#pragma once

#include <omp.h>

#include <cstdint>

#include "core/tensor.h"

namespace accrue::cpu {

// Each thread's part starts on its own 128-byte boundary (two cache lines, the pair the
// adjacent-line prefetcher fetches together): small parts rewritten for every plane, as max
// pooling's, would otherwise share their boundary lines, and the cores would pass those lines
// back and forth (that ran the pooling 3x slower).
template <typename T>
struct ThreadScratch {
  static constexpr int64_t kPartAlign = 128 / int64_t(sizeof(T));
  int64_t size;
  Tensor buffer;
  ThreadScratch(int64_t rows, int64_t cols, DType dtype)
      : size((rows * cols + kPartAlign - 1) / kPartAlign * kPartAlign),
        buffer(Tensor::empty({omp_get_max_threads(), size}, dtype, Device::cpu())) {}
  T* mine() { return buffer.data<T>() + omp_get_thread_num() * size; }
};

}  // namespace accrue::cpu
