// CPU loops, named like the CUDA launch helpers (kernels/cuda/launch.cuh) so the two backends
// read side by side: map1 / map2 run a functor over flat arrays, for_each runs a body per
// element, for_range per row or block, for_chunks per fixed chunk. Each forks OpenMP threads only
// when the work pays for the fork (kParallelGrain elements in all); smaller micro-batch tensors
// run on the calling thread. Every OpenMP pragma of the CPU backend lives in this file or in a
// row helper beside its kernel, never inside a dispatch macro's body. The maps load each
// element into its compute type and round once on the store (float for the 16-bit types).
#pragma once

#include <cstdint>

#include "core/half.h"

namespace accrue::cpu {

// Below this much work a loop runs on one thread: elements, or bytes for a copy that waits on
// memory latency (gather_rows).
constexpr int64_t kParallelGrain = 1 << 15;

// body(i) for i in [0, n)
template <typename F>
void for_each(int64_t n, F body) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// y[i] = f(x[i])
template <typename T, typename F>
void map1(int64_t n, const T* x, T* y, F f) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(f(load(x[i])));
}

// out[i] = f(a[i], b[i]); out may have another type than the inputs (a float32 sum
// fed by 16-bit values), the arithmetic is in the inputs' compute type.
template <typename T, typename O, typename F>
void map2(int64_t n, const T* a, const O* b, O* out, F f) {
  using C = compute_t<T>;
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    out[i] = store<O>(f(load(a[i]), static_cast<C>(load(b[i]))));
  }
}

// body(i) for i in [0, count): rows or column blocks, each touching work / count elements (or
// bytes, as the caller counts).
template <typename F>
void for_range(int64_t count, int64_t work, F body) {
#pragma omp parallel for schedule(static) if (parallel : work >= kParallelGrain)
  for (int64_t i = 0; i < count; ++i) body(i);
}

// body(r) for every row of an [rows, cols] matrix.
template <typename F>
void for_rows(int64_t rows, int64_t cols, F body) {
  for_range(rows, rows * cols, body);
}

// body(c, begin, end) over [0, n) in chunks of `chunk`; chunk boundaries depend only on n, so a
// reduction that combines per-chunk results in chunk order is deterministic.
template <typename F>
void for_chunks(int64_t n, int64_t chunk, F body) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  for_range(chunks, n, [&](int64_t c) {
    const int64_t begin = c * chunk;
    body(c, begin, begin + chunk < n ? begin + chunk : n);
  });
}

}  // namespace accrue::cpu
