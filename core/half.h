// The two 16-bit floating types, bfloat16 and float16 (IEEE binary16), as storage structs with
// round-to-nearest-even conversions written once for host and device. Arithmetic never happens
// in 16 bits: kernels load an element into its compute type (compute_t<T>, float for both),
// work in float and round once on the store. bfloat16 is the top half of a float32 (8 exponent
// bits: the same range, 8 significant bits); float16 has 5 exponent bits (largest 65504,
// smallest normal 2^-14, subnormals down to 2^-24) and 11 significant bits, which is why fp16
// training needs loss scaling and bf16 does not. Read next: dtype.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define ACCRUE_HALF_HD __host__ __device__ __forceinline__
#else
#define ACCRUE_HALF_HD inline
#endif

namespace accrue {

namespace half_bits {

ACCRUE_HALF_HD uint32_t of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

ACCRUE_HALF_HD float to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// float32 -> bfloat16, round to nearest even; NaN stays NaN (quieted, sign kept).
// Written as a select, without a branch, so that loops writing bfloat16 vectorise.
ACCRUE_HALF_HD uint16_t bf16_from_float(float f) {
  const uint32_t u = of(f);
  const uint32_t nan = (u >> 16) | 0x0040u;
  // Adding 0x7fff plus the kept part's last bit rounds to nearest even; the carry runs into the
  // exponent, so past the largest value it rounds up to inf.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

ACCRUE_HALF_HD float bf16_to_float(uint16_t h) {
  return to_float(static_cast<uint32_t>(h) << 16);
}

// float32 -> float16, round to nearest even, through subnormals, to inf above 65504 (from
// 65520, the midpoint to the next power of two, which rounds to even: up); NaN stays NaN.
ACCRUE_HALF_HD uint16_t f16_from_float(float f) {
  uint32_t u = of(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // inf, or rounds to it
  if (u < 0x38800000u) {
    // Below 2^-14: a subnormal. Adding 0.5 puts the value's 2^-24 units in the low mantissa bits
    // of a float with exponent -1, and the float adder rounds them to nearest even.
#if defined(__CUDA_ARCH__)
    const float shifted = __fadd_rn(to_float(u), 0.5f);  // never fused into a multiply-add
#else
    const float shifted = to_float(u) + 0.5f;
#endif
    return static_cast<uint16_t>(sign | (of(shifted) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;
  return static_cast<uint16_t>(sign | (u >> 13));
}

ACCRUE_HALF_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t rest = h & 0x7fffu;
  if (rest >= 0x7c00u) return to_float(sign | 0x7f800000u | ((rest & 0x3ffu) << 13));  // inf, NaN
  if (rest >= 0x0400u) return to_float(sign | ((rest << 13) + 0x38000000u));  // normal: + 112 << 23
  const float magnitude = static_cast<float>(rest) * 5.9604644775390625e-8f;  // rest x 2^-24
  return to_float(sign | of(magnitude));
}

}  // namespace half_bits

// The two formats' conversions, as the parameter of HalfFloat.
struct BF16Format {
  ACCRUE_HALF_HD static uint16_t from_float(float f) { return half_bits::bf16_from_float(f); }
  ACCRUE_HALF_HD static float to_float(uint16_t h) { return half_bits::bf16_to_float(h); }
};
struct F16Format {
  ACCRUE_HALF_HD static uint16_t from_float(float f) { return half_bits::f16_from_float(f); }
  ACCRUE_HALF_HD static float to_float(uint16_t h) { return half_bits::f16_to_float(h); }
};

// A 16-bit float of one of the two formats, stored as its bits. Converting from any arithmetic
// type goes through float (a double is rounded to float first); converting to float is exact.
template <typename Format>
struct HalfFloat {
  uint16_t bits;
  HalfFloat() = default;
  template <typename U, typename = std::enable_if_t<std::is_arithmetic_v<U>>>
  ACCRUE_HALF_HD explicit HalfFloat(U value)
      : bits(Format::from_float(static_cast<float>(value))) {}
  ACCRUE_HALF_HD operator float() const { return Format::to_float(bits); }
  ACCRUE_HALF_HD static HalfFloat from_bits(uint16_t b) {
    HalfFloat h;
    h.bits = b;
    return h;
  }
};

using bf16 = HalfFloat<BF16Format>;
using f16 = HalfFloat<F16Format>;
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2 && std::is_trivially_copyable_v<bf16>);

template <typename T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// The type a kernel computes in for elements of type T: float for the 16-bit types.
template <typename T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

// Loads an element into its compute type; stores a computed value back, rounding once.
template <typename T>
ACCRUE_HALF_HD compute_t<T> load(T v) {
  return static_cast<compute_t<T>>(v);
}
template <typename T, typename C>
ACCRUE_HALF_HD T store(C v) {
  return static_cast<T>(v);
}

}  // namespace accrue
