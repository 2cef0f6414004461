// Fixed-width vectors for the CPU loops whose shape the compiler cannot vectorise well by itself
// (rows shorter than a vector, even / odd lanes): kLanes values of T as a GCC vector-extension
// type, which the compiler maps onto whatever registers -march gives (two AVX2 registers, or one
// AVX-512 register, for 8 doubles). Loads and stores go through the vector type itself, not
// memcpy, so the compiler knows they touch only T values and keeps sizes in registers across them.
#pragma once

#include <cstdint>

namespace accrue::cpu::vec {

constexpr int64_t kLanes = 8;

template <typename T>
struct Lanes;
template <>
struct Lanes<float> {
  using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
  using Unaligned = float __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));
  using Index = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
};
template <>
struct Lanes<double> {
  using Vec = double __attribute__((vector_size(kLanes * sizeof(double))));
  using Unaligned = double __attribute__((vector_size(kLanes * sizeof(double)), aligned(8)));
  using Index = int64_t __attribute__((vector_size(kLanes * sizeof(int64_t))));
};
template <typename T>
using Vec = typename Lanes<T>::Vec;

template <typename T>
Vec<T> load(const T* p) {
  return *reinterpret_cast<const typename Lanes<T>::Unaligned*>(p);
}
template <typename T>
void store(T* p, const Vec<T>& v) {
  *reinterpret_cast<typename Lanes<T>::Unaligned*>(p) = v;
}

// dst [n] = src [n] (not overlapping), for short rows: whole vectors, the last one ending at n
// (overlapping the one before it), so there is no scalar tail and nothing is read or written
// outside the rows. GCC would turn the loops into memmove calls, which cost more than the copy for
// rows of a few dozen values.
template <typename T>
void copy_row(const T* __restrict src, int64_t n, T* __restrict dst) {
  if (n < kLanes) {
    for (int64_t i = 0; i < n; ++i) {
      dst[i] = src[i];
      asm("" : "+r"(i));  // hides the loop's pattern from GCC's memmove recognition; no code
    }
    return;
  }
  for (int64_t i = 0;; i += kLanes) {
    if (i + kLanes >= n) return store(dst + n - kLanes, load(src + n - kLanes));
    store(dst + i, load(src + i));
    asm("" : "+r"(i));
  }
}

}  // namespace accrue::cpu::vec
