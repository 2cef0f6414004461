// Per-thread scratch for CPU kernels that share work out over the OpenMP team: one [rows, cols]
// buffer of T per thread, taken from the caching allocator (so it counts as activation memory and
// is reused across calls instead of allocated per row or sample).
#pragma once

#include <omp.h>

#include <cstdint>

#include "core/tensor.h"

namespace accrue::cpu {

template <typename T>
struct ThreadScratch {
  int64_t size;
  Tensor buffer;
  ThreadScratch(int64_t rows, int64_t cols, DType dtype)
      : size(rows * cols),
        buffer(Tensor::empty({omp_get_max_threads(), rows * cols}, dtype, Device::cpu())) {}
  T* mine() { return buffer.data<T>() + omp_get_thread_num() * size; }
};

}  // namespace accrue::cpu
