// Bit-exact contracts of the CPU's vector code, checked against its scalar formulas: permute moves
// each element where its index says, the 16-bit lanes convert as rows.h's row conversions, the
// vector exp gives std::exp's bits, and the softmax loops keep the bits of their scalar formulas.
// The kernels are compiled for the machine and the tests are not, so the vector code is reached
// through the library as built (the probes in kernels/cpu/*_probe.h).
#include <cstring>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/exp_probe.h"
#include "kernels/cpu/half_lanes_probe.h"
#include "kernels/cpu/row_probe.h"
#include "kernels/cpu/rows.h"
#include "test_util.h"

namespace accrue::testing {
namespace {

// Every 4099th float bit pattern: all signs, exponents, subnormals and NaN payloads among them.
std::vector<float> every_4099th_float() {
  std::vector<float> values;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    const auto b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, sizeof f);
    values.push_back(f);
  }
  return values;
}

// The CPU permute (runs of the last dimension when it stays last, else single elements, in blocks
// that step through y's coordinates) against the index formula written out: y at coordinates c
// is x at the coordinates c[inverse of dims]. Raw bytes, each element's own index in them, so 2-,
// 4- and 8-byte elements alike; shapes with many blocks (runs and single elements, on threads), a
// few long runs, odd sizes, size-1 dimensions, rank 1 and an empty tensor.
TEST(Backend, PermuteMovesEachElementWhereItsIndexSays) {
  Backend& be = backend_for(Device::cpu());
  struct Case {
    Shape shape, dims;
    DType dtype;
  };
  const Case cases[] = {{{5, 37, 3, 4, 24}, {2, 0, 3, 1, 4}, DType::kFloat32},
                        {{300, 130}, {1, 0}, DType::kFloat32},  // single elements, threads
                        {{40, 1, 7, 33}, {2, 1, 0, 3}, DType::kFloat32},  // a carry through 1
                        {{2, 3, 40000}, {1, 0, 2}, DType::kFloat32},      // 6 long runs
                        {{3, 1, 5, 2}, {1, 3, 0, 2}, DType::kBFloat16},
                        {{17, 9, 13}, {1, 0, 2}, DType::kFloat64},
                        {{6, 5, 4, 3, 2}, {4, 3, 2, 1, 0}, DType::kInt32},
                        {{11}, {0}, DType::kFloat16},
                        {{0, 4}, {1, 0}, DType::kFloat32}};
  for (const Case& k : cases) {
    Tensor x = Tensor::empty(k.shape, k.dtype, Device::cpu());
    const size_t unit = dtype_size(k.dtype), rank = k.shape.size();
    auto* bytes = static_cast<unsigned char*>(x.raw());
    for (int64_t e = 0; e < x.numel(); ++e) {  // each element holds its own index (little-endian)
      for (size_t b = 0; b < unit; ++b)
        bytes[e * unit + b] = static_cast<unsigned char>(e >> (8 * b));
    }
    Shape out_shape;
    for (int64_t d : k.dims) out_shape.push_back(k.shape[static_cast<size_t>(d)]);
    Tensor y = Tensor::empty(out_shape, k.dtype, Device::cpu());
    be.permute(x, k.dims, y);
    for (int64_t j = 0; j < y.numel(); ++j) {
      std::vector<int64_t> at(rank);  // y's coordinates of element j, then x's flat index
      for (size_t d = rank, rest = static_cast<size_t>(j); d-- > 0;) {
        at[d] = static_cast<int64_t>(rest) % out_shape[d];
        rest /= static_cast<size_t>(out_shape[d]);
      }
      std::vector<int64_t> x_at(rank);
      for (size_t d = 0; d < rank; ++d) x_at[static_cast<size_t>(k.dims[d])] = at[d];
      int64_t source = 0;
      for (size_t d = 0; d < rank; ++d) source = source * k.shape[d] + x_at[d];
      ASSERT_EQ(std::memcmp(static_cast<const unsigned char*>(y.raw()) + j * unit,
                            bytes + source * unit, unit),
                0)
          << "element " << j << " of " << shape_str(k.shape) << " permuted by "
          << shape_str(k.dims);
    }
  }
}

// vec::copy_row (im2col's, the pooling's and Winograd's row copies, as built) writes the row and
// nothing around it, at every length from empty through several vectors, for 2-, 4- and 8-byte
// elements: whole vectors, the last ending at the row's end, and rows shorter than a vector as two
// overlapping moves (copy_short). Guard bytes on both sides of the destination must survive.
TEST(Backend, RowCopiesWriteTheRowAndNothingAroundIt) {
  const auto check = [](auto zero) {
    using T = decltype(zero);
    constexpr int64_t kGuard = 64;
    for (int64_t n = 0; n <= 80; ++n) {
      std::vector<unsigned char> src(size_t(n) * sizeof(T)), dst(src.size() + 2 * kGuard, 0xab);
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
      cpu::copy_row_as_built(src.data(), n, int64_t(sizeof(T)), dst.data() + kGuard);
      for (int64_t i = 0; i < kGuard; ++i) {
        ASSERT_EQ(dst[size_t(i)], 0xab) << sizeof(T) << "-byte row of " << n << ": before it";
        ASSERT_EQ(dst[size_t(kGuard) + src.size() + size_t(i)], 0xab)
            << sizeof(T) << "-byte row of " << n << ": after it";
      }
      if (n > 0) {  // memcmp takes no null pointer, even for no bytes
        ASSERT_EQ(std::memcmp(dst.data() + kGuard, src.data(), src.size()), 0)
            << sizeof(T) << "-byte row of " << n;
      }
    }
  };
  check(bf16{});
  check(float{});
  check(double{});
}

// vec::add_row (col2im's fold, as built) adds each element once, exactly as a scalar loop does, at
// every length from empty through several vectors (AVX-512's masked last vector included), and
// writes nothing around the row.
TEST(Backend, RowAddsAreTheScalarSumsAndWriteNothingAroundTheRow) {
  const auto check = [](auto zero) {
    using T = decltype(zero);
    constexpr int64_t kGuard = 16;
    for (int64_t n = 0; n <= 80; ++n) {
      // src holds ones past its n values, so a lane added past the row changes the guard
      std::vector<T> src(static_cast<size_t>(n + kGuard), T(1));
      std::vector<T> out(static_cast<size_t>(n + 2 * kGuard), T(-7.25));
      for (int64_t i = 0; i < n; ++i) {
        src[size_t(i)] = T(0.1) * T(i + 1);
        out[size_t(kGuard + i)] = T(1) / T(i + 3);
      }
      std::vector<T> want = out;
      for (int64_t i = 0; i < n; ++i) want[size_t(kGuard + i)] += src[size_t(i)];
      cpu::add_row_as_built(src.data(), n, out.data() + kGuard);
      ASSERT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(T)), 0)
          << sizeof(T) << "-byte row of " << n;
    }
  };
  check(float{});
  check(double{});
}

// The 16-bit lanes of the direct convolutions (vec::load_widened, vec::store_rounded, as the
// library was built) convert as rows.h's row_to_float and row_from_float do, bit for bit: every
// bfloat16 and float16 pattern widened; rounded, every 4099th float pattern (all signs, exponents,
// subnormals and NaN payloads among them) and the edges: ties to even either way, the largest
// values that round down and the first that round to infinity, the smallest subnormals, -0.
TEST(Backend, SixteenBitLanesConvertAsTheRowConversions) {
  const auto check = [](auto zero) {
    using H = decltype(zero);
    std::vector<H> every(65536);
    for (uint32_t bits = 0; bits < 65536; ++bits) every[bits] = H::from_bits(uint16_t(bits));
    std::vector<float> want(every.size()), got(every.size());
    cpu::row_to_float(every.data(), want.data(), int64_t(every.size()));
    cpu::widen_lanes(every.data(), int64_t(every.size()), got.data());
    int64_t mismatches = 0;
    for (size_t i = 0; i < every.size(); ++i) {
      if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0 && ++mismatches <= 5) {
        ADD_FAILURE() << "widening 16-bit pattern " << i << ": " << got[i] << " against "
                      << want[i];
      }
    }
    EXPECT_EQ(mismatches, 0) << "widened";
    std::vector<float> values = every_4099th_float();
    for (uint32_t b :
         {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0x477fefffu,
          0x477ff000u, 0x33000000u, 0x33000001u, 0x00000001u, 0x80000001u, 0x80000000u, 0x7f800001u,
          0xffc00001u, 0x7fbfffffu, 0x3f801000u, 0x3f803000u}) {
      float f;
      std::memcpy(&f, &b, sizeof f);
      values.push_back(f);
    }
    while (values.size() % 16 != 0) values.push_back(1.0f);
    std::vector<H> want16(values.size()), got16(values.size());
    cpu::row_from_float(values.data(), want16.data(), int64_t(values.size()));
    cpu::round_lanes(values.data(), int64_t(values.size()), got16.data());
    mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (want16[i].bits != got16[i].bits && ++mismatches <= 5) {
        ADD_FAILURE() << "rounding " << values[i] << ": bits " << got16[i].bits << " against "
                      << want16[i].bits;
      }
    }
    EXPECT_EQ(mismatches, 0) << "rounded, of " << values.size();
  };
  check(bf16{});
  check(f16{});
}

// vec::exp_lanes gives std::exp's bits (kernels/cpu/exp.h): every 4099th float bit pattern (all
// signs, magnitudes, subnormals and NaN payloads among them), the values softmax sees most densely
// ([-20, 0] in steps of 2^-9), and the edges of glibc's fast path, lanes mixed so that one slow
// lane sends a vector to the library. Checked once over all 2^32 floats on AVX-512 and AVX2 builds.
TEST(Backend, VectorExpGivesStdExpBits) {
  if (!cpu::vector_exp_in_kernels()) {
    GTEST_SKIP() << "the library targets no FMA (or has no glibc): its softmax loops call std::exp";
  }
  std::vector<float> values = every_4099th_float();
  for (float f = -20.0f; f <= 0.0f; f += 0x1p-9f) values.push_back(f);
  // a vector of the fast path's edges alone, then one with a slow lane among them
  while (values.size() % 8 != 0) values.push_back(1.0f);
  const float below = std::nextafter(88.0f, 0.0f);
  for (float edge :
       {below,       -below,      0.0f,    -0.0f,    0x1p-149f, -0x1p-149f, 87.5f,     -87.5f,
        below,       -below,      0.0f,    -0.0f,    88.0f,     -88.0f,     88.72283f, 88.72284f,
        -103.27893f, -103.97208f, -104.0f, INFINITY, -INFINITY, NAN,        1.0f,      2.0f}) {
    values.push_back(edge);
  }
  std::vector<float> got(values.size());
  cpu::exp_floats(values.data(), static_cast<int64_t>(values.size()), got.data());
  int64_t mismatches = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const float want = std::exp(values[i]);
    if (std::memcmp(&want, &got[i], sizeof want) != 0 && ++mismatches <= 5) {
      ADD_FAILURE() << "exp(" << values[i] << "): " << got[i] << " against std::exp's " << want;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << values.size() << " values";
}

// The float softmax loops keep the bits of their scalar formulas with the vector exponentials:
// cross_entropy's probabilities exp(x - lse) and causal_softmax's exp(s x - max) / sum and zeros
// after the query (s x - max fused where the library targets FMA, as GCC contracts the scalar
// formula), rows of lengths around the vector width, values large enough to take glibc's slow path,
// outputs filled with NaN first.
TEST(Backend, SoftmaxKeepsScalarExpBits) {
  Backend& be = backend_for(Device::cpu());
  std::mt19937 gen(3);
  for (int64_t cols : {1, 7, 8, 9, 17, 40}) {
    for (float spread : {1.0f, 60.0f}) {
      const int64_t rows = 5;
      std::normal_distribution<float> normal(0.0f, spread);
      Tensor x = Tensor::empty({rows, cols}, DType::kFloat32, Device::cpu());
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = normal(gen);
      Tensor labels = Tensor::zeros({rows}, DType::kInt32, Device::cpu());
      Tensor loss = Tensor::empty({1}, DType::kFloat32, Device::cpu());
      Tensor probs = full({rows, cols}, NAN);
      be.cross_entropy(x, labels, loss, probs);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = x.data<float>() + r * cols;
        float max = row[0], total = 0;
        for (int64_t c = 1; c < cols; ++c) max = row[c] > max ? row[c] : max;
        for (int64_t c = 0; c < cols; ++c) total += std::exp(row[c] - max);
        const float lse = max + std::log(total);
        for (int64_t c = 0; c < cols; ++c) {
          const float want = std::exp(row[c] - lse), got = probs.data<float>()[r * cols + c];
          EXPECT_EQ(std::memcmp(&want, &got, sizeof want), 0)
              << "cross_entropy [" << rows << ", " << cols << "] spread " << spread << " row " << r
              << " column " << c << ": " << got << " against " << want;
        }
      }
      // causal_softmax over [1, T, T] with T = cols
      Tensor scores = Tensor::empty({1, cols, cols}, DType::kFloat32, Device::cpu());
      for (int64_t i = 0; i < scores.numel(); ++i) scores.data<float>()[i] = normal(gen);
      Tensor y = full({1, cols, cols}, NAN);
      const float s = 0.35f;
      be.causal_softmax(s, scores, y);
      const auto shifted = [&](float v, float max) {
        return cpu::kernels_fuse_scaled_shift() ? std::fma(s, v, -max) : s * v - max;
      };
      for (int64_t q = 0; q < cols; ++q) {
        const float* row = scores.data<float>() + q * cols;
        float max = s * row[0], total = 0;
        for (int64_t k = 1; k <= q; ++k) max = s * row[k] > max ? s * row[k] : max;
        for (int64_t k = 0; k <= q; ++k) total += std::exp(shifted(row[k], max));
        for (int64_t k = 0; k < cols; ++k) {
          const float want = k <= q ? std::exp(shifted(row[k], max)) / total : 0.0f;
          const float got = y.data<float>()[q * cols + k];
          EXPECT_EQ(std::memcmp(&want, &got, sizeof want), 0)
              << "causal_softmax T = " << cols << " spread " << spread << " query " << q << " key "
              << k << ": " << got << " against " << want;
        }
      }
    }
  }
}

}  // namespace
}  // namespace accrue::testing
