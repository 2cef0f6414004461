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
// A comparison's result: lanes of -1 (true) or 0, as wide as T.
template <typename T>
using Mask = typename Lanes<T>::Index;
using Int32 = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
using UnalignedInt32 = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t)), aligned(4)));

template <typename T>
Vec<T> load(const T* p) {
  return *reinterpret_cast<const typename Lanes<T>::Unaligned*>(p);
}
template <typename T>
void store(T* p, const Vec<T>& v) {
  *reinterpret_cast<typename Lanes<T>::Unaligned*>(p) = v;
}

// kLanes int32 values, converted from a mask-wide index vector (the same type for float).
template <typename Index>
void store_int32(int32_t* p, const Index& v) {
  *reinterpret_cast<UnalignedInt32*>(p) = __builtin_convertvector(v, Int32);
}

// The even (or odd) lanes of the 2 kLanes values a then b.
template <typename T>
Vec<T> evens(const Vec<T>& a, const Vec<T>& b) {
  return __builtin_shuffle(a, b, Mask<T>{0, 2, 4, 6, 8, 10, 12, 14});
}
template <typename T>
Vec<T> odds(const Vec<T>& a, const Vec<T>& b) {
  return __builtin_shuffle(a, b, Mask<T>{1, 3, 5, 7, 9, 11, 13, 15});
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
