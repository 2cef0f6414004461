// exp of kLanes floats at once with the bits of std::exp(float): the softmax loops' exponentials,
// which otherwise run one library call per value (about 5 ns each). std::exp(float) on this
// project's platform is glibc's expf, and on x86-64 CPUs with FMA and AVX2 glibc runs its FMA build
// of it: x is taken to double, written as (k + r) ln2 / 32 with integer k, and
//   exp(x) = 2^(k / 32) (1 + C2 r + C1 r^2 + C0 r^3)
// with 2^(k / 32) from a table of the 32 values 2^(j / 32) (their bit patterns less j << 47, so
// adding k << 47 puts k / 32 in the exponent) and the cubic evaluated as three fused
// multiply-adds, then rounded to float once. The same operations on a vector of doubles give
// the same bits lane by lane; the constants below are the values that library reads (looked up in
// it, not derived). Backend.VectorExpGivesStdExpBits (tests/test_backend_bits.cpp) compares the two
// on a sample of every float bit pattern; all 2^32 matched on AVX-512 and AVX2 builds. Lanes whose
// |x| reaches 88 (overflow, underflow, NaN and infinities: glibc's own branch to a slow path) send
// the whole vector to std::exp.
//
// kVectorExp says whether the build can use it: an x86-64 build for FMA and AVX2 against glibc 2.27
// or later (where this expf appeared). glibc then picks its FMA expf at run time too, unless told
// otherwise (GLIBC_TUNABLES masking the CPU's features), which the build cannot see; its other
// builds round z and r separately.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/vec.h"

namespace accrue::cpu::vec {

#if defined(__x86_64__) && defined(__FMA__) && defined(__AVX2__) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 27))
constexpr bool kVectorExp = true;
#else
constexpr bool kVectorExp = false;
#endif

namespace exp_detail {

// 2^(j / 32) as bits, less j << 47, j = 0 ... 31.
constexpr uint64_t kTable[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};
constexpr uint64_t kInvLn2Scaled = 0x40471547652b82fe;  // 32 / ln 2
constexpr uint64_t kShift = 0x4338000000000000;         // 1.5 2^52: adding it rounds to an integer
constexpr uint64_t kC0 = 0x3ebc6af84b912394, kC1 = 0x3f2ebfce50fac4f3, kC2 = 0x3f962e42ff0c52d6;
// float bits with (bits >> 20) & 0x7ff above this: |x| >= 88, infinities and NaN
constexpr uint32_t kSlowTop = 0x42a;

inline double bits_to_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

}  // namespace exp_detail

// exp of each lane of x, the bits of std::exp(x[i]) where glibc runs its FMA expf. Requires
// kVectorExp.
inline Vec<float> exp_lanes(const Vec<float>& x) {
  namespace d = exp_detail;
  using Doubles = Vec<double>;
  typedef uint64_t Bits __attribute__((vector_size(kLanes * sizeof(uint64_t))));
  typedef uint32_t FloatBits __attribute__((vector_size(kLanes * sizeof(uint32_t))));
  const FloatBits top = (reinterpret_cast<FloatBits>(x) >> 20) & 0x7ffu;
  bool slow = false;
  for (int64_t i = 0; i < kLanes; ++i) slow |= top[i] > d::kSlowTop;
  if (slow) {
    Vec<float> r{};
    for (int64_t i = 0; i < kLanes; ++i) r[i] = std::exp(x[i]);
    return r;
  }
  const Doubles inv_ln2 = splat<Doubles>(d::bits_to_double(d::kInvLn2Scaled));
  const Doubles shift = splat<Doubles>(d::bits_to_double(d::kShift));
  const Doubles xd = __builtin_convertvector(x, Doubles);
  Doubles kd = fma(inv_ln2, xd, shift);  // k + shift: k in the low bits
  const Bits ki = reinterpret_cast<Bits>(kd);
  kd -= shift;
  const Doubles r = fma(inv_ln2, xd, -kd);
  Bits t{};
  for (int64_t i = 0; i < kLanes; ++i) t[i] = d::kTable[ki[i] % 32];
  t += ki << 47;
  const Doubles s = reinterpret_cast<Doubles>(t);
  const Doubles z =
      fma(r, splat<Doubles>(d::bits_to_double(d::kC0)), splat<Doubles>(d::bits_to_double(d::kC1)));
  const Doubles r2 = r * r;
  Doubles y = fma(r, splat<Doubles>(d::bits_to_double(d::kC2)), splat<Doubles>(1.0));
  y = fma(z, r2, y);
  return __builtin_convertvector(y * s, Vec<float>);
}

}  // namespace accrue::cpu::vec
