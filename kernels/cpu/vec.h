// Fixed-width vectors for the CPU loops whose shape the compiler cannot vectorise well by itself
// (rows shorter than a vector, even / odd lanes): kLanes values of T as a GCC vector-extension
// type, which the compiler maps onto whatever registers -march gives (two AVX2 registers, or one
// AVX-512 register, for 8 doubles). Loads and stores go through the vector type itself, not
// memcpy, so the compiler knows they touch only T values and keeps sizes in registers across them.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // fma, max and splat's instructions, where the build targets them
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/half.h"
#include "kernels/cpu/rows.h"

namespace accrue::cpu::vec {

constexpr int64_t kLanes = 8;

// N values of T (float or double), and a comparison's result: lanes of -1 (true) or 0 as wide as T.
template <typename T, int64_t N = kLanes>
struct Lanes {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "float or double");
  using IndexValue = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  // typedefs: GCC drops the attributes of a dependent alias declaration
  typedef T Vec __attribute__((vector_size(N * sizeof(T))));
  typedef T Unaligned __attribute__((vector_size(N * sizeof(T)), aligned(sizeof(T))));
  typedef IndexValue Index __attribute__((vector_size(N * sizeof(T))));
  typedef int32_t Int32 __attribute__((vector_size(N * sizeof(int32_t))));
  typedef int32_t UnalignedInt32 __attribute__((vector_size(N * sizeof(int32_t)), aligned(4)));
};
template <typename T, int64_t N = kLanes>
using Vec = typename Lanes<T, N>::Vec;
template <typename T, int64_t N = kLanes>
using Mask = typename Lanes<T, N>::Index;

// The lane count of a vector of T.
template <typename T, typename V>
constexpr int64_t lanes_of = static_cast<int64_t>(sizeof(V) / sizeof(T));

template <typename T, int64_t N = kLanes>
Vec<T, N> load(const T* p) {
  return *reinterpret_cast<const typename Lanes<T, N>::Unaligned*>(p);
}
template <typename T, typename V>
void store(T* p, const V& v) {
  static_assert(std::is_same_v<std::remove_cv_t<std::remove_reference_t<decltype(v[0])>>, T>,
                "a vector of T");
  *reinterpret_cast<typename Lanes<T, lanes_of<T, V>>::Unaligned*>(p) = v;
}

// 16-bit rows as float vectors (mixed precision): N bfloat16 or float16 values widened (exactly)
// into N float lanes, and N float lanes rounded into N 16-bit values, bit for bit as rows.h's
// row_to_float and row_from_float convert them (F16C for float16 where the build targets it;
// otherwise through those functions on a copy). For float and double both are load and store.
// The AVX-512 conversions are the masked forms with every lane selected, as in
// greater_else_second below.
template <int64_t N>
struct HalfLanes {  // N 16-bit values as their bits, and as many 32-bit lanes
  typedef uint16_t Bits __attribute__((vector_size(N * 2), aligned(2)));
  typedef uint32_t Wide __attribute__((vector_size(N * 4)));
};
template <typename S, int64_t N = kLanes>
Vec<compute_t<S>, N> load_widened(const S* p) {
  if constexpr (std::is_same_v<S, bf16>) {
    using Bits = typename HalfLanes<N>::Bits;
    using Wide = typename HalfLanes<N>::Wide;
    const Wide wide = __builtin_convertvector(*reinterpret_cast<const Bits*>(p), Wide) << 16;
    return reinterpret_cast<Vec<float, N>>(wide);
  } else if constexpr (std::is_same_v<S, f16>) {
#if defined(__AVX512F__)
    if constexpr (N == 16) {
      return reinterpret_cast<Vec<float, N>>(
          _mm512_mask_cvtph_ps(_mm512_setzero_ps(), __mmask16(-1),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
    }
#endif
#if defined(__F16C__)
    if constexpr (N == 8) {
      return reinterpret_cast<Vec<float, N>>(
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    } else if constexpr (N == 16) {  // no AVX-512: two halves of 8
      const Vec<float, 8> halves[2] = {load_widened<S, 8>(p), load_widened<S, 8>(p + 8)};
      Vec<float, N> v;
      std::memcpy(&v, halves, sizeof v);
      return v;
    }
#endif
    float wide[N];
    row_to_float(p, wide, N);
    return load<float, N>(wide);
  } else {
    return load<S, N>(p);
  }
}
template <typename S, typename V>
void store_rounded(S* p, const V& v) {
  using Lane = std::remove_cv_t<std::remove_reference_t<decltype(v[0])>>;
  static_assert(!is_half_v<S> || std::is_same_v<Lane, float>, "16-bit values round float lanes");
  if constexpr (std::is_same_v<S, bf16>) {
    constexpr int64_t N = lanes_of<float, V>;
    using Bits = typename HalfLanes<N>::Bits;
    using Wide = typename HalfLanes<N>::Wide;
    // core/half.h's bf16_from_float, lane by lane: nearest even, NaN quieted with its sign kept
    const Wide u = reinterpret_cast<Wide>(v);
    const Wide nan = (u >> 16) | 0x0040u;
    const Wide rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const Wide bits = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    *reinterpret_cast<Bits*>(p) = __builtin_convertvector(bits, Bits);
  } else if constexpr (std::is_same_v<S, f16>) {
    constexpr int64_t N = lanes_of<float, V>;
#if defined(__AVX512F__)
    if constexpr (N == 16) {
      return _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(p),
          _mm512_mask_cvtps_ph(_mm256_setzero_si256(), __mmask16(-1), reinterpret_cast<__m512>(v),
                               _MM_FROUND_TO_NEAREST_INT));
    }
#endif
#if defined(__F16C__)
    if constexpr (N == 8) {
      return _mm_storeu_si128(
          reinterpret_cast<__m128i*>(p),
          _mm256_cvtps_ph(reinterpret_cast<__m256>(v), _MM_FROUND_TO_NEAREST_INT));
    } else if constexpr (N == 16) {  // no AVX-512: two halves of 8
      Vec<float, 8> halves[2];
      std::memcpy(halves, &v, sizeof halves);
      store_rounded(p, halves[0]);
      return store_rounded(p + 8, halves[1]);
    }
#endif
    float wide[N];
    store(wide, v);
    row_from_float(wide, p, N);
  } else {
    store(p, v);
  }
}

// The lanes of an index vector of T's width (a Mask<T, N>), stored as N int32 values.
template <typename T, typename Index>
void store_int32(int32_t* p, const Index& v) {
  using L = Lanes<T, lanes_of<T, Index>>;
  *reinterpret_cast<typename L::UnalignedInt32*>(p) = __builtin_convertvector(v, typename L::Int32);
}

// The lanes of an int32 array as an index vector of T's width (a Mask<T, N>).
template <typename T, int64_t N = kLanes>
Mask<T, N> load_int32(const int32_t* p) {
  using L = Lanes<T, N>;
  return __builtin_convertvector(*reinterpret_cast<const typename L::UnalignedInt32*>(p),
                                 typename L::Index);
}

// f applied to the two halves of 64-byte vectors, each half 32 bytes (an AVX register), and the
// halves put back together: how the helpers below run a vector of 64 bytes without AVX-512.
template <typename V, typename F, typename... Vs>
V by_halves(F f, const V& first, const Vs&... rest) {
  using T = std::remove_cv_t<std::remove_reference_t<decltype(first[0])>>;
  using Half = Vec<T, 32 / sizeof(T)>;
  static_assert(sizeof(V) == 2 * sizeof(Half) && (std::is_same_v<Vs, V> && ...),
                "vectors of 64 bytes, all of one type");
  const auto half = [](const V& v, int k) {
    Half h;
    std::memcpy(&h, reinterpret_cast<const char*>(&v) + k * sizeof(Half), sizeof(Half));
    return h;
  };
  const Half result[2] = {f(half(first, 0), half(rest, 0)...), f(half(first, 1), half(rest, 1)...)};
  V r;
  std::memcpy(&r, result, sizeof(V));
  return r;
}

// a b + c lane by lane, each lane rounded once (fused), whatever the optimisation level or the
// contraction setting (a plain a * b + c is fused only where the compiler contracts it): the
// x86 instructions for vectors of 64 or 32 bytes where the build targets them (a vector of 64
// bytes as two of 32 on AVX2), else std::fma per lane.
template <typename V>
V fma(const V& a, const V& b, const V& c) {
  using T = std::remove_cv_t<std::remove_reference_t<decltype(a[0])>>;
  constexpr bool is_float = std::is_same_v<T, float>;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64 && is_float) {
    return reinterpret_cast<V>(_mm512_fmadd_ps(
        reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
  } else if constexpr (sizeof(V) == 64) {
    return reinterpret_cast<V>(_mm512_fmadd_pd(
        reinterpret_cast<__m512d>(a), reinterpret_cast<__m512d>(b), reinterpret_cast<__m512d>(c)));
  }
#endif
#if defined(__FMA__)
  if constexpr (sizeof(V) == 32 && is_float) {
    return reinterpret_cast<V>(_mm256_fmadd_ps(
        reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b), reinterpret_cast<__m256>(c)));
  } else if constexpr (sizeof(V) == 32) {
    return reinterpret_cast<V>(_mm256_fmadd_pd(
        reinterpret_cast<__m256d>(a), reinterpret_cast<__m256d>(b), reinterpret_cast<__m256d>(c)));
  }
  if constexpr (sizeof(V) == 64) {  // no AVX-512
    return by_halves([](const auto& x, const auto& y, const auto& z) { return fma(x, y, z); }, a, b,
                     c);
  }
#endif
  V r = c;
  for (size_t i = 0; i < sizeof(V) / sizeof(T); ++i) r[i] = std::fma(a[i], b[i], c[i]);
  return r;
}

// a > b ? a : b lane by lane (b where either is NaN, and b of two zeros): exactly the x86 max
// instruction, one instruction where GCC compiles the select on vector types to a comparison and a
// blend. Vectors of 64 or 32 bytes where the build targets them (64 as two of 32 without
// AVX-512), else the select itself. The AVX-512 forms are the masked ones with every lane selected:
// GCC 12 warns that the plain ones' undefined pass-through may be used uninitialised.
template <typename V>
V greater_else_second(const V& a, const V& b) {
  using T = std::remove_cv_t<std::remove_reference_t<decltype(a[0])>>;
  constexpr bool is_float = std::is_same_v<T, float>;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64 && is_float) {
    const auto x = reinterpret_cast<__m512>(a), y = reinterpret_cast<__m512>(b);
    return reinterpret_cast<V>(_mm512_mask_max_ps(x, __mmask16(-1), x, y));
  } else if constexpr (sizeof(V) == 64) {
    const auto x = reinterpret_cast<__m512d>(a), y = reinterpret_cast<__m512d>(b);
    return reinterpret_cast<V>(_mm512_mask_max_pd(x, __mmask8(-1), x, y));
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32 && is_float) {
    return reinterpret_cast<V>(
        _mm256_max_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b)));
  } else if constexpr (sizeof(V) == 32) {
    return reinterpret_cast<V>(
        _mm256_max_pd(reinterpret_cast<__m256d>(a), reinterpret_cast<__m256d>(b)));
  }
  if constexpr (sizeof(V) == 64) {  // no AVX-512
    return by_halves([](const auto& x, const auto& y) { return greater_else_second(x, y); }, a, b);
  }
#endif
  return a > b ? a : b;
}

// Every lane x (V{} + x would add +0 to x first, which the compiler must keep, as x may be -0; and
// a loop over the lanes compiles to a broadcast of half a register and a shuffle).
template <typename V, typename T>
V splat(T x) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64 && std::is_same_v<T, float>) {
    return reinterpret_cast<V>(_mm512_set1_ps(x));
  } else if constexpr (sizeof(V) == 64) {
    return reinterpret_cast<V>(_mm512_set1_pd(x));
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32 && std::is_same_v<T, float>) {
    return reinterpret_cast<V>(_mm256_set1_ps(x));
  } else if constexpr (sizeof(V) == 32) {
    return reinterpret_cast<V>(_mm256_set1_pd(x));
  }
#endif
  V v{};
  for (size_t i = 0; i < sizeof(V) / sizeof(T); ++i) v[i] = x;
  return v;
}

// The index vector {first, first + step, first + 2 step, ...} of M's lanes.
template <typename M, int64_t First, int64_t Step, size_t... I>
constexpr M strided(std::index_sequence<I...>) {
  return M{static_cast<std::remove_reference_t<decltype(M{}[0])>>(First + Step * int64_t(I))...};
}
template <typename M, int64_t First, int64_t Step>
constexpr M strided() {
  return strided<M, First, Step>(std::make_index_sequence<sizeof(M) / sizeof(M{}[0])>());
}

// The even (or odd) lanes of the 2 N values a then b.
template <typename T, int64_t N = kLanes>
Vec<T, N> evens(const Vec<T, N>& a, const Vec<T, N>& b) {
  return __builtin_shuffle(a, b, strided<Mask<T, N>, 0, 2>());
}
template <typename T, int64_t N = kLanes>
Vec<T, N> odds(const Vec<T, N>& a, const Vec<T, N>& b) {
  return __builtin_shuffle(a, b, strided<Mask<T, N>, 1, 2>());
}

// The lanes of a and b alternating, {a0, b0, a1, b1, ...}: its first N lanes (zip_low) or its last
// N (zip_high).
template <typename M, int64_t First, size_t... I>
constexpr M zipped(std::index_sequence<I...>) {
  constexpr int64_t n = sizeof...(I);
  return M{static_cast<std::remove_reference_t<decltype(M{}[0])>>((I % 2) * n + First + I / 2)...};
}
template <typename T, int64_t N = kLanes>
Vec<T, N> zip_low(const Vec<T, N>& a, const Vec<T, N>& b) {
  return __builtin_shuffle(a, b, zipped<Mask<T, N>, 0>(std::make_index_sequence<N>()));
}
template <typename T, int64_t N = kLanes>
Vec<T, N> zip_high(const Vec<T, N>& a, const Vec<T, N>& b) {
  return __builtin_shuffle(a, b, zipped<Mask<T, N>, N / 2>(std::make_index_sequence<N>()));
}

// The N x N matrix whose rows are v[0], ..., v[N - 1] transposed in place: v[k] becomes its column
// k. Each of log2 N rounds interleaves rows i and i + N / 2 into rows 2 i and 2 i + 1 (zip_low,
// zip_high): a perfect shuffle of the values' row and column bits, which after log2 N rounds have
// traded places (Stone's shuffle network).
template <typename T, int64_t N>
void transpose(Vec<T, N> (&v)[N]) {
  static_assert(N > 1 && (N & (N - 1)) == 0, "a power of two");
#pragma GCC unroll 8
  for (int64_t round = 1; round < N; round *= 2) {
    Vec<T, N> next[N];
#pragma GCC unroll 16
    for (int64_t i = 0; i < N / 2; ++i) {
      next[2 * i] = zip_low<T, N>(v[i], v[i + N / 2]);
      next[2 * i + 1] = zip_high<T, N>(v[i], v[i + N / 2]);
    }
#pragma GCC unroll 16
    for (int64_t i = 0; i < N; ++i) v[i] = next[i];
  }
}

// out [n] += src [n] (not overlapping), one add per element, so the sums are a plain loop's: float
// rows in 16-lane vectors on AVX-512, the last one masked (a row of 14 floats is one masked add
// instead of 8 lanes and 6 scalar adds); otherwise the compiler's loop. For col2im's short rows:
// rows.h's add_into, the same sum, keeps the compiler's unrolled loop, which long rows (the column
// sums) need (docs/cpu-speed.md).
template <typename T>
void add_row(const T* __restrict src, int64_t n, T* __restrict out) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(out + i), _mm512_loadu_ps(src + i)));
    }
    if (i < n) {
      const auto lanes = static_cast<__mmask16>((1u << (n - i)) - 1);
      _mm512_mask_storeu_ps(out + i, lanes,
                            _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, out + i),
                                          _mm512_maskz_loadu_ps(lanes, src + i)));
    }
    return;
  }
#endif
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] += src[i];
}

// dst [bytes] = src [bytes] (not overlapping) for a row shorter than 64 bytes: two moves of the
// largest power of two up to 32 bytes that fits, the second ending at the row's end (they overlap
// unless the length is that power), so a row of 14 bfloat16 values is two 16-byte moves instead
// of 14 scalar ones. The constant-size memcpy calls compile to single loads and stores.
inline void copy_short(const char* __restrict src, int64_t bytes, char* __restrict dst) {
  const auto twice = [&](auto size) {
    constexpr int64_t kSize = decltype(size)::value;
    std::memcpy(dst, src, kSize);
    std::memcpy(dst + bytes - kSize, src + bytes - kSize, kSize);
  };
  if (bytes >= 32) return twice(std::integral_constant<int64_t, 32>{});
  if (bytes >= 16) return twice(std::integral_constant<int64_t, 16>{});
  if (bytes >= 8) return twice(std::integral_constant<int64_t, 8>{});
  if (bytes >= 4) return twice(std::integral_constant<int64_t, 4>{});
  if (bytes >= 2) return twice(std::integral_constant<int64_t, 2>{});
  if (bytes == 1) *dst = *src;
}

// dst [n] = src [n] (not overlapping), for short rows: whole vectors, the last one ending at n
// (overlapping the one before it), so there is no scalar tail and nothing is read or written
// outside the rows; a row shorter than a vector as copy_short. GCC would turn the loops into
// memmove calls, which cost more than the copy for rows of a few dozen values.
// 16-bit elements (bf16, f16) move as their bits, 16 to a vector.
typedef uint16_t Bits16 __attribute__((vector_size(32), aligned(2)));
template <typename T>
void copy_row(const T* __restrict src, int64_t n, T* __restrict dst) {
  static_assert(std::is_trivially_copyable_v<T>);
  if constexpr (sizeof(T) == 2) {
    constexpr int64_t kBits16Lanes = 16;
    const auto* in = reinterpret_cast<const uint16_t*>(src);
    auto* out = reinterpret_cast<uint16_t*>(dst);
    if (n < kBits16Lanes) {
      return copy_short(reinterpret_cast<const char*>(src), n * 2, reinterpret_cast<char*>(dst));
    }
    for (int64_t i = 0;; i += kBits16Lanes) {
      const int64_t at = std::min(i, n - kBits16Lanes);
      *reinterpret_cast<Bits16*>(out + at) = *reinterpret_cast<const Bits16*>(in + at);
      if (at + kBits16Lanes >= n) return;
      asm("" : "+r"(i));
    }
  } else {
    if (n < kLanes) {
      return copy_short(reinterpret_cast<const char*>(src), n * int64_t(sizeof(T)),
                        reinterpret_cast<char*>(dst));
    }
    for (int64_t i = 0;; i += kLanes) {
      if (i + kLanes >= n) return store(dst + n - kLanes, load(src + n - kLanes));
      store(dst + i, load(src + i));
      asm("" : "+r"(i));
    }
  }
}

}  // namespace accrue::cpu::vec
