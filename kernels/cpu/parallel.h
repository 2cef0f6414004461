// CPU loops: element-wise maps over flat arrays, split across OpenMP threads when the array is
// large enough to pay for the fork (small micro-batch tensors run on the calling thread).
#pragma once

#include <cstdint>

namespace accrue::cpu {

// Below this many elements a loop runs on one thread.
constexpr int64_t kParallelGrain = 1 << 15;

// y[i] = f(x[i])
template <typename T, typename F>
void map(int64_t n, const T* x, T* y, F f) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

// out[i] = f(a[i], b[i])
template <typename T, typename F>
void map2(int64_t n, const T* a, const T* b, T* out, F f) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}

// body(begin, end) over [0, n) in chunks of `chunk`; chunk boundaries depend only on n, so a
// reduction that combines per-chunk results in chunk order is deterministic.
template <typename F>
void for_chunks(int64_t n, int64_t chunk, F body) {
  const int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (parallel : n >= kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * chunk;
    body(c, begin, begin + chunk < n ? begin + chunk : n);
  }
}

}  // namespace accrue::cpu
