// Mixed precision: the 16-bit conversions checked over every bit pattern against a reference
// written here from the formats' definitions; a model training on a bfloat16 or float16 working
// copy with float32 masters; dynamic loss scaling stepping once per window (the same scale
// trajectory for k = 1 and k = 8), rescuing gradients that underflow float16, and skipping and
// backing off after an overflow; accumulation in bfloat16 against the full batch.
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/cpu/bf16_products.h"
#include "test_util.h"

namespace accrue::testing {
namespace {

// ---- Conversions ----------------------------------------------------------------------------

// The value of a 16-bit pattern from the format's definition: sign, a biased exponent of
// `exp_bits` bits, a fraction of `frac_bits` bits, subnormals at the smallest exponent.
double reference_value(uint16_t bits, int exp_bits, int frac_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const bool negative = bits >> 15;
  const int exponent = (bits >> frac_bits) & ((1 << exp_bits) - 1);
  const int fraction = bits & ((1 << frac_bits) - 1);
  double magnitude;
  if (exponent == (1 << exp_bits) - 1) {
    magnitude = fraction ? NAN : INFINITY;
  } else if (exponent == 0) {
    magnitude = std::ldexp(fraction, 1 - bias - frac_bits);
  } else {
    magnitude = std::ldexp((1 << frac_bits) + fraction, exponent - bias - frac_bits);
  }
  return negative ? -magnitude : magnitude;
}

struct Format {
  const char* name;
  int exp_bits, frac_bits;
  float (*to_float)(uint16_t);
  uint16_t (*from_float)(float);
};
const Format kFormats[] = {
    {"bfloat16", 8, 7, half_bits::bf16_to_float, half_bits::bf16_from_float},
    {"float16", 5, 10, half_bits::f16_to_float, half_bits::f16_from_float},
};

class Conversion : public ::testing::TestWithParam<Format> {};

TEST_P(Conversion, EveryPatternDecodesToItsDefinedValueAndRoundTrips) {
  const Format f = GetParam();
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const double want = reference_value(bits, f.exp_bits, f.frac_bits);
    const float got = f.to_float(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << f.name << " 0x" << std::hex << b;
      const uint16_t again = f.from_float(got);
      ASSERT_TRUE(std::isnan(reference_value(again, f.exp_bits, f.frac_bits)))
          << f.name << " NaN 0x" << std::hex << b << " came back as 0x" << again;
      ASSERT_EQ(again >> 15, bits >> 15) << "the sign of a NaN is kept";
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << f.name << " 0x" << std::hex << b;
    ASSERT_EQ(f.from_float(got), bits) << f.name << " 0x" << std::hex << b << " round trip";
  }
}

// Between two neighbouring finite values: the midpoint goes to the one with an even last bit,
// anything nearer goes to the nearer one (round to nearest, ties to even), in both signs and
// through the subnormals.
TEST_P(Conversion, RoundsToNearestEvenBetweenEveryPairOfNeighbours) {
  const Format f = GetParam();
  const uint16_t inf = static_cast<uint16_t>(((1 << f.exp_bits) - 1) << f.frac_bits);
  for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
    for (uint16_t lo = 0; lo + 1 < inf; ++lo) {
      const uint16_t hi = lo + 1;
      const double a = reference_value(lo, f.exp_bits, f.frac_bits);
      const double b = reference_value(hi, f.exp_bits, f.frac_bits);
      const double mid =
          (a + b) / 2;  // exact in double, and in float (one more bit than the format)
      const double s = sign ? -1.0 : 1.0;
      const uint16_t even = (lo & 1) ? hi : lo;
      ASSERT_EQ(f.from_float(static_cast<float>(s * mid)), even | sign) << f.name << " " << mid;
      const float below = std::nextafter(static_cast<float>(mid), 0.0f);
      const float above = std::nextafter(static_cast<float>(mid), INFINITY);
      ASSERT_EQ(f.from_float(static_cast<float>(s) * below), lo | sign) << f.name << " " << mid;
      ASSERT_EQ(f.from_float(static_cast<float>(s) * above), hi | sign) << f.name << " " << mid;
    }
  }
}

TEST_P(Conversion, OverflowGoesToInfinityFromTheLastMidpoint) {
  const Format f = GetParam();
  const uint16_t inf = static_cast<uint16_t>(((1 << f.exp_bits) - 1) << f.frac_bits);
  const double largest = reference_value(inf - 1, f.exp_bits, f.frac_bits);
  const double next = std::ldexp(1.0, static_cast<int>(std::log2(largest)) + 1);
  const double mid = (largest + next) / 2;
  if (mid < 3.4e38) {  // bfloat16's midpoint is above float32's largest value
    EXPECT_EQ(f.from_float(static_cast<float>(mid)), inf) << "the tie rounds to even: up";
    EXPECT_EQ(f.from_float(std::nextafter(static_cast<float>(mid), 0.0f)), inf - 1);
  }
  EXPECT_EQ(f.from_float(INFINITY), inf);
  EXPECT_EQ(f.from_float(-INFINITY), inf | 0x8000);
  EXPECT_EQ(f.from_float(static_cast<float>(largest)), inf - 1);
  EXPECT_EQ(f.from_float(3.4028235e38f), inf) << "float32's largest is past bfloat16's midpoint";
  EXPECT_EQ(f.from_float(-0.0f), 0x8000);
}

// Tensor casts (both backends' cast primitive) agree with the scalar conversions on every
// pattern, through float32 and float64.
TEST_P(Conversion, TensorCastsAgreeWithTheScalarConversion) {
  const Format f = GetParam();
  const DType half = f.exp_bits == 8 ? DType::kBFloat16 : DType::kFloat16;
  std::vector<float> values;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float v = f.to_float(static_cast<uint16_t>(b));
    values.push_back(v);
    values.push_back(std::nextafter(v, INFINITY));  // an in-between value that must round
  }
  const Tensor src = Tensor::from_vector<float>({int64_t(values.size())}, values);
  for (Device device : devices()) {
    for (DType via : {DType::kFloat32, DType::kFloat64}) {
      const Tensor out = to_dtype(to_dtype(src, via).to(device), half).to(Device::cpu());
      const uint16_t* bits = static_cast<const uint16_t*>(out.raw());
      for (size_t i = 0; i < values.size(); ++i) {
        if (std::isnan(values[i])) continue;
        ASSERT_EQ(bits[i], f.from_float(values[i]))
            << f.name << " " << values[i] << " via " << dtype_name(via) << " on " << device.str();
      }
    }
  }
}

// One format's GEMM conversions on the path chosen now (see the test below).
void gemm_conversions_agree(const Format& f, bool flushes_subnormals) {
  const DType half = f.exp_bits == 8 ? DType::kBFloat16 : DType::kFloat16;
  std::vector<float> finite;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float v = f.to_float(static_cast<uint16_t>(b));
    // -0 is left out: a GEMM's sum starts from +0, so -0 x 1 comes out +0 (as in float32).
    if (std::isfinite(v) && !(v == 0 && std::signbit(v))) finite.push_back(v);
  }
  const int64_t n = static_cast<int64_t>(finite.size());
  const Tensor a = to_dtype(Tensor::from_vector<float>({n, 1}, finite), half);
  for (double factor : {1.0, 1.0 + std::ldexp(1.0, -11)}) {
    const Tensor b = to_dtype(full({1, 1}, factor, DType::kFloat32), half);
    const float exact_factor = static_cast<float>(to_dtype(b, DType::kFloat64).item());
    for (Device device : devices()) {
      Tensor c = Tensor::empty({n, 1}, half, device);
      backend_for(device).gemm(false, false, 1.0, a.to(device), b.to(device), 0.0, c);
      const Tensor host = c.to(Device::cpu());
      const uint16_t* bits = static_cast<const uint16_t*>(host.raw());
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want = f.from_float(finite[i] * exact_factor);
        const bool subnormal = std::fpclassify(finite[i]) == FP_SUBNORMAL ||
                               std::fpclassify(f.to_float(want)) == FP_SUBNORMAL;
        const bool flushed = (bits[i] & 0x7fff) == 0;  // +0 or -0
        if (flushes_subnormals && device.is_cpu() && half == DType::kBFloat16 && subnormal &&
            flushed) {
          continue;
        }
        ASSERT_EQ(bits[i], want) << f.name << " " << finite[i] << " x " << exact_factor << " on "
                                 << device.str();
      }
    }
  }
}

// The GEMM's own conversions (the CPU converts operand panels, with F16C for float16 where the
// CPU has it, and rounds C on the store): every pattern times 1 comes back unchanged, and every
// pattern times 1 + 2^-11 (exact in float32, between 16-bit values) rounds as the scalar code.
// bfloat16 runs on both CPU paths (kernels/cpu/bf16_products.h). The native one multiplies with
// AVX512-BF16's dot products, which treat subnormal inputs as zero and flush subnormal results
// to zero: there a subnormal comes back as +0 or exactly, every other pattern exactly.
TEST_P(Conversion, GemmConversionsAgreeWithTheScalarOnes) {
  const cpu::Bf16Products before = cpu::bf16_products();
  for (cpu::Bf16Products path : {cpu::Bf16Products::kConverted, cpu::Bf16Products::kNative}) {
    cpu::set_bf16_products(path);
    SCOPED_TRACE(cpu::bf16_products_library());
    gemm_conversions_agree(GetParam(), path == cpu::Bf16Products::kNative);
  }
  cpu::set_bf16_products(before);
}

INSTANTIATE_TEST_SUITE_P(Formats, Conversion, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- Training on a 16-bit working copy --------------------------------------------------------

struct Mixed {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::ParameterArena> arena;
  std::unique_ptr<optim::Adam> adam;
  std::unique_ptr<optim::Accumulator> acc;
  Tensor x, y;    // the dataset, in the working dtype
  DType working;  // float32: no working copy
  double loss_weight = 1.0;
};

// An MLP with float32 masters on `samples` random samples, a `working` copy (float32: none) and
// loss scaling when `scale` > 0 (dynamic unless `fixed`).
Mixed make_mixed(DType working, double scale, int64_t samples = 128, int growth_interval = 2000,
                 bool fixed = false, Device device = Device::cpu()) {
  Mixed s;
  nn::manual_seed(21);
  s.model = std::make_shared<nn::Sequential>();
  s.model->add(std::make_shared<nn::Linear>(12, 32));
  s.model->add(std::make_shared<nn::ReLU>());
  s.model->add(std::make_shared<nn::Linear>(32, 16));
  s.model->add(std::make_shared<nn::Tanh>());
  s.model->add(std::make_shared<nn::Linear>(16, 5));
  s.model->to(device);
  s.arena = std::make_unique<optim::ParameterArena>(*s.model);
  if (working != DType::kFloat32) s.arena->use_working_copy(working);
  s.adam = std::make_unique<optim::Adam>(*s.arena);
  if (scale > 0) {
    LossScaling ls;
    ls.dynamic = !fixed;
    ls.growth_interval = growth_interval;
    s.adam->set_loss_scaling(ls, scale);
  }
  s.acc = std::make_unique<optim::Accumulator>(*s.adam, optim::AccumulatorOptions{});
  s.working = working;
  s.x = to_dtype(random({samples, 12}, 3, DType::kFloat32, -2, 2), working).to(device);
  std::vector<int32_t> labels(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) labels[i] = static_cast<int32_t>((i * 3 + i / 7) % 5);
  s.y = Tensor::from_vector<int32_t>({samples}, labels, device);
  return s;
}

// The sum-reduced float32 loss of rows [start, start + n), the logits cast up from 16 bits.
Tensor mixed_loss(Mixed& s, int64_t start, int64_t n) {
  const Tensor logits = cast((*s.model)(s.x.narrow(start, n)), DType::kFloat32);
  Tensor loss = cross_entropy(logits, s.y.narrow(start, n));
  return s.loss_weight == 1.0 ? loss : scale(loss, s.loss_weight);
}

// One window over rows [start, start + total) in micro-batches of `micro`.
optim::StepResult mixed_window(Mixed& s, int64_t start, int64_t total, int64_t micro) {
  s.acc->begin_window(total);
  for (int64_t at = start; at < start + total; at += micro) {
    s.acc->micro_step(micro, [&] { return mixed_loss(s, at, micro); });
  }
  return s.acc->step();
}

// The gradient arena after the micro-steps of one window (no step taken).
Tensor mixed_gradient(Mixed& s, int64_t total, int64_t micro) {
  s.acc->begin_window(total);
  for (int64_t at = 0; at < total; at += micro) {
    s.acc->micro_step(micro, [&] { return mixed_loss(s, at, micro); });
  }
  return s.arena->grads().clone();
}

TEST(MixedPrecision, TheWorkingCopyIsTheMasterRoundedAndGradientsStayFloat32) {
  for (DType half : {DType::kBFloat16, DType::kFloat16}) {
    Mixed s = make_mixed(half, half == DType::kFloat16 ? 65536 : 0);
    for (const auto& e : s.arena->entries()) {
      EXPECT_EQ(e.param.dtype(), half) << e.name;
      EXPECT_EQ(e.master.dtype(), DType::kFloat32) << e.name;
      EXPECT_EQ(e.param.grad().dtype(), DType::kFloat32) << e.name;
    }
    for (int step = 0; step < 3; ++step) {
      const optim::StepResult r = mixed_window(s, 0, 128, 32);
      ASSERT_FALSE(r.skipped);
      // After every update the working copy is exactly the master rounded once.
      EXPECT_EQ(as_doubles(s.arena->working()), as_doubles(to_dtype(s.arena->masters(), half)))
          << dtype_name(half) << " step " << step;
    }
    EXPECT_EQ(s.arena->named_masters().front().second.dtype(), DType::kFloat32);
  }
}

// A bf16 token table's gradient rows are summed in float32 and reach its float32 buffer as those
// sums, not rounded to bf16 first (as the other layers' GEMMs and norms write theirs).
TEST(MixedPrecision, EmbeddingGradientsReachTheFloat32BufferUnrounded) {
  nn::manual_seed(1);
  nn::Embedding table(5, 3);
  optim::ParameterArena arena(table);
  arena.use_working_copy(DType::kBFloat16);
  const std::vector<int32_t> rows{2, 0, 2, 4, 2, 0};
  const Tensor index = Tensor::from_vector<int32_t>({6}, rows);
  const Tensor r = to_dtype(random({6, 3}, 7, DType::kFloat32), DType::kBFloat16);
  backward(sum(mul(table(index), r)));  // d/d table[v] = the rows of r at v's positions
  const Tensor grad = arena.entries().front().param.grad();
  ASSERT_EQ(grad.dtype(), DType::kFloat32);
  const std::vector<float> dy = to_dtype(r, DType::kFloat32).to_vector<float>();
  std::vector<float> want(5 * 3, 0.0f);
  for (size_t p = 0; p < rows.size(); ++p) {
    for (size_t c = 0; c < 3; ++c) want[size_t(rows[p]) * 3 + c] += dy[p * 3 + c];
  }
  EXPECT_EQ(grad.to_vector<float>(), want);
  // The sums need float32: rounded to bf16 they would differ (else this test shows nothing).
  EXPECT_NE(as_doubles(to_dtype(to_dtype(grad, DType::kBFloat16), DType::kFloat32)),
            as_doubles(grad));
}

// 32 x 4 against 128 x 1 in bfloat16. Each sample's forward and backward see the same weights
// and the same inputs in both splits, and every activation and activation gradient is a float32
// result rounded once to bfloat16; the two runs can differ only where the float32 results
// differ in their last bits (a GEMM cut or a sum in another order) and that straddles a bfloat16
// rounding boundary, flipping one value by one bfloat16 unit, 2^-8 relative; and the arena sums
// the four micro-batches in float32 in another order (~1e-7). So the window gradients may
// differ by at most about one bfloat16 rounding, relative: the bound is u = 2^-8. They must also
// stay far closer to each other than bfloat16 is to float32, or the test proves nothing.
TEST(MixedPrecision, Bf16AccumulationMatchesTheFullBatch) {
  Mixed full = make_mixed(DType::kBFloat16, 0), split = make_mixed(DType::kBFloat16, 0);
  Mixed fp32 = make_mixed(DType::kFloat32, 0);
  const Tensor reference = mixed_gradient(full, 128, 128);
  const Tensor got = mixed_gradient(split, 128, 32);
  const double split_error = rel_l2(got, reference);
  const double precision_gap = rel_l2(reference, mixed_gradient(fp32, 128, 128));
  EXPECT_LE(split_error, std::ldexp(1.0, -8));
  EXPECT_GT(precision_gap, 10 * split_error);
  std::printf(
      "bf16 window gradient: 32 x 4 vs 128 x 1 relative L2 %.3g (bound 2^-8 = %.3g); "
      "bf16 vs fp32 %.3g\n",
      split_error, std::ldexp(1.0, -8), precision_gap);
}

// A loss weighted by 1e-6 has gradients around 1e-9 at the logits, below float16's smallest
// subnormal (2^-24, 6e-8): unscaled, every gradient flushes to zero and nothing trains; scaled
// by 2^16 they are representable and match float32's, and the loss falls.
TEST(MixedPrecision, LossScalingRescuesFloat16GradientsThatUnderflow) {
  Mixed unscaled = make_mixed(DType::kFloat16, 0), scaled = make_mixed(DType::kFloat16, 65536);
  Mixed fp32 = make_mixed(DType::kFloat32, 0);
  for (Mixed* s : {&unscaled, &scaled, &fp32}) s->loss_weight = 1e-6;
  const Tensor none = mixed_gradient(unscaled, 128, 32);
  const Tensor rescued = mixed_gradient(scaled, 128, 32);
  const Tensor reference = mixed_gradient(fp32, 128, 32);
  double largest = 0;
  for (double v : as_doubles(none)) largest = std::max(largest, std::abs(v));
  EXPECT_EQ(largest, 0.0) << "float16 without scaling should lose every gradient here";
  // The arena holds S x the gradient until the boundary unscales it.
  const Tensor unscaled_rescued = scale(rescued, 1.0 / 65536);
  EXPECT_LT(rel_l2(unscaled_rescued, reference), 2e-2);
  // Training: the scaled run learns, the other never moves.
  unscaled.acc->abandon_window();
  scaled.acc->abandon_window();
  const auto loss_at_start = [](Mixed& s) {
    NoGradGuard no_grad;
    return mixed_loss(s, 0, 128).item();
  };
  const double start = loss_at_start(scaled);
  for (int step = 0; step < 30; ++step) {
    EXPECT_FALSE(mixed_window(scaled, 0, 128, 32).skipped);
    mixed_window(unscaled, 0, 128, 32);
  }
  // Slowly (gradients of 1e-9 sit under Adam's eps of 1e-8), but steadily: measured 1.7%.
  EXPECT_LT(loss_at_start(scaled), 0.99 * start);
  EXPECT_EQ(loss_at_start(unscaled), start) << "no gradient, no update";
}

// The scale trajectory: steps whose scale was too large for float16 overflow and are skipped,
// each halving the scale, until the gradients fit; an injected overflow (one sample whose input
// overflows float16 activations) skips its window and halves the scale again; clean windows
// grow it after the interval. Updates happen per window, so k = 1 and k = 8 give the same
// trajectory and the same weights' fate.
TEST(MixedPrecision, ScaleStepsOncePerWindowTheSameForOneAndEightMicroSteps) {
  std::vector<std::vector<double>> scales;
  std::vector<std::vector<bool>> skips;
  for (int64_t k : {1, 8}) {
    Mixed s = make_mixed(DType::kFloat16, std::ldexp(1.0, 25), 64 * 12, 3);
    // Sample 64 * 6 + 5, in window 6, overflows float16 in the first layer.
    Tensor host = to_dtype(s.x, DType::kFloat32);
    fill_(host.narrow(64 * 6 + 5, 1), 60000.0);
    s.x = to_dtype(host, DType::kFloat16);
    std::vector<double> scale_of_step;
    std::vector<bool> skipped;
    for (int64_t w = 0; w < 12; ++w) {
      const optim::StepResult r = mixed_window(s, 64 * w, 64, 64 / k);
      scale_of_step.push_back(r.loss_scale);
      skipped.push_back(r.skipped);
    }
    scales.push_back(scale_of_step);
    skips.push_back(skipped);
    EXPECT_EQ(s.acc->skipped_steps(), std::count(skipped.begin(), skipped.end(), true));
  }
  EXPECT_EQ(scales[0], scales[1]);
  EXPECT_EQ(skips[0], skips[1]);
  const std::vector<double>& sc = scales[0];
  const std::vector<bool>& sk = skips[0];
  ASSERT_TRUE(sk[0]) << "2^25 overflows float16 gradients";
  size_t first_clean = 0;
  while (first_clean < sk.size() && sk[first_clean]) ++first_clean;
  ASSERT_LT(first_clean, 6u) << "halving must reach a scale that fits";
  for (size_t i = 1; i <= first_clean; ++i) EXPECT_EQ(sc[i], sc[i - 1] / 2) << "backoff at " << i;
  EXPECT_TRUE(sk[6]) << "the injected overflow";
  EXPECT_EQ(sc[7], sc[6] / 2);
  EXPECT_FALSE(sk[7]) << "training goes on after the injected overflow";
  // Growth: three clean windows in a row double the scale.
  EXPECT_FALSE(sk[8] || sk[9]);
  EXPECT_EQ(sc[10], 2 * sc[7]);
}

// The whole mixed-precision step on every other device against the CPU: the same skips and
// scales (from 2^25, so the first windows overflow), masters within the bound below, and the
// working copy the masters rounded.
//
// The masters' bound, as a relative L2 norm ||cuda - cpu|| / ||cpu||. Adam's first step moves
// every weight by lr sign(g) (m^ / sqrt(v^) = g / |g|), whatever the gradient's size, so a
// gradient near zero whose sign the device's summation order flips moves its weight by 2 lr: a
// per-weight bound would have to allow 2 lr a step. Every other difference is the gradients'
// relative rounding times lr a step, orders of magnitude less. The bound allows one weight in
// twenty such a flip: 2 lr sqrt(N / 20) / ||cpu||, 3.3e-3 for this MLP (N = 1040 arena slots,
// 1029 weights and padding; ||cpu|| = 4.36). An Adam step wrong on every weight once moves them
// lr sqrt(N), 2.2 times the bound.
TEST(MixedPrecision, EveryDeviceTrainsLikeTheCpu) {
  int compared = 0;
  for (Device device : devices()) {
    if (device.is_cpu()) continue;
    for (DType half : {DType::kBFloat16, DType::kFloat16}) {
      const double scale = half == DType::kFloat16 ? std::ldexp(1.0, 25) : 0;
      Mixed cpu = make_mixed(half, scale, 64 * 8, 3);
      Mixed dev = make_mixed(half, scale, 64 * 8, 3, false, device);
      for (int64_t w = 0; w < 8; ++w) {
        const optim::StepResult a = mixed_window(cpu, 64 * w, 64, 16);
        const optim::StepResult b = mixed_window(dev, 64 * w, 64, 16);
        EXPECT_EQ(a.skipped, b.skipped) << dtype_name(half) << " window " << w;
        EXPECT_EQ(a.loss_scale, b.loss_scale) << dtype_name(half) << " window " << w;
      }
      const std::vector<double> masters = as_doubles(cpu.arena->masters());
      const double norm =
          std::sqrt(std::inner_product(masters.begin(), masters.end(), masters.begin(), 0.0));
      const double n = static_cast<double>(masters.size());
      const double bound = 2 * optim::AdamOptions{}.lr * std::sqrt(n / 20) / norm;
      EXPECT_LT(rel_l2(dev.arena->masters(), cpu.arena->masters()), bound)
          << dtype_name(half) << " on " << device.str();
      EXPECT_EQ(as_doubles(dev.arena->working()),
                as_doubles(to_dtype(dev.arena->masters().to(Device::cpu()), half)));
    }
    ++compared;
  }
  if (compared == 0) GTEST_SKIP() << "no device besides the CPU: " << cuda_unavailable_reason();
}

// As GradScaler: growth stops short of infinity (an infinite seed would skip every window after).
TEST(MixedPrecision, TheScaleNeverGrowsToInfinity) {
  for (Device device : devices()) {
    Tensor scaler = Tensor::from_vector<float>({2}, {std::ldexp(1.0f, 127), 0.0f}, device);
    Tensor out = Tensor::empty({4}, DType::kFloat32, device);
    Tensor steps = Tensor::zeros({1}, DType::kInt32, device);
    LossScaling ls;
    ls.dynamic = true;
    ls.growth_interval = 1;
    const Tensor norm_sq = Tensor::from_vector<float>({2}, {1.0f, 0.0f}, device);
    for (int i = 0; i < 3; ++i) {
      backend_for(device).boundary(norm_sq, 1.0, 0.0, ls, scaler, out, steps);
    }
    EXPECT_EQ(scaler.to_vector<float>()[0], std::ldexp(1.0f, 127)) << device.str();
    EXPECT_EQ(steps.to_vector<int32_t>()[0], 3);
  }
}

TEST(MixedPrecision, Bf16TrainsWithoutScalingAndCloseToFloat32) {
  Mixed bf = make_mixed(DType::kBFloat16, 0), fp = make_mixed(DType::kFloat32, 0);
  double bf_loss = 0, fp_loss = 0;
  for (int step = 0; step < 40; ++step) {
    bf_loss = mixed_window(bf, 0, 128, 32).loss;
    fp_loss = mixed_window(fp, 0, 128, 32).loss;
  }
  EXPECT_NEAR(bf_loss, fp_loss, 0.05 * fp_loss);
  EXPECT_EQ(bf.adam->scaler_state().first, 1.0);
}

// Misuse of the working copy and of the loss scale, each a row: the error names the problem.
TEST(MixedPrecision, MisuseIsRejectedWithTheReason) {
  struct Case {
    const char* name;
    std::function<void()> run;
    const char* expect;
  };
  const std::vector<Case> cases{
      {"working copy in float32",
       [] {
         nn::Linear l(3, 2);
         optim::ParameterArena a(l);
         a.use_working_copy(DType::kFloat32);
       },
       "bfloat16 or float16"},
      {"working copy of float64 masters",
       [] {
         nn::Linear l(3, 2, true, DType::kFloat64);
         optim::ParameterArena a(l);
         a.use_working_copy(DType::kBFloat16);
       },
       "float32 master"},
      {"working copy twice",
       [] {
         nn::Linear l(3, 2);
         optim::ParameterArena a(l);
         a.use_working_copy(DType::kBFloat16);
         a.use_working_copy(DType::kBFloat16);
       },
       "already"},
      {"loss scale 0",
       [] {
         nn::Linear l(3, 2);
         optim::ParameterArena a(l);
         optim::Adam adam(a);
         adam.set_loss_scaling({}, 0.0);
       },
       "loss scale"},
      {"loss scale NaN",
       [] {
         nn::Linear l(3, 2);
         optim::ParameterArena a(l);
         optim::Adam adam(a);
         adam.set_loss_scaling({}, NAN);
       },
       "loss scale"},
      {"backoff 1",
       [] {
         nn::Linear l(3, 2);
         optim::ParameterArena a(l);
         optim::Adam adam(a);
         LossScaling ls;
         ls.dynamic = true;
         ls.backoff = 1.0;
         adam.set_loss_scaling(ls, 1024);
       },
       "backoff"},
      {"softmax in bfloat16",
       [] {
         log_softmax(Tensor::zeros({2, 3}, DType::kBFloat16));
       },
       "[log_softmax] expects float32 or float64, got bfloat16"},
      {"16-bit GEMM into float64",
       [] {
         Tensor a = Tensor::zeros({2, 3}, DType::kBFloat16),
                b = Tensor::zeros({3, 2}, DType::kBFloat16);
         Tensor c = Tensor::zeros({2, 2}, DType::kFloat64);
         backend_for(Device::cpu()).gemm(false, false, 1.0, a, b, 1.0, c);
       },
       "cannot write a bfloat16 result into a float64 tensor"},
  };
  for (const Case& c : cases) {
    try {
      c.run();
      ADD_FAILURE() << c.name << ": no error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos)
          << c.name << ": " << e.what();
    }
  }
}

TEST(MixedPrecision, SafetensorsKeepBf16AndF16Bits) {
  const std::string path = ::testing::TempDir() + "accrue_half.safetensors";
  const Tensor values = random({5, 7}, 9, DType::kFloat32, -1000, 1000);
  const Tensor bf = to_dtype(values, DType::kBFloat16), f = to_dtype(values, DType::kFloat16);
  optim::save_safetensors(path, {{"bf", bf}, {"f", f}});
  const auto loaded = optim::read_safetensors(path);
  EXPECT_EQ(loaded.at("bf").dtype(), DType::kBFloat16);
  EXPECT_EQ(loaded.at("f").dtype(), DType::kFloat16);
  EXPECT_EQ(std::memcmp(loaded.at("bf").raw(), bf.raw(), bf.nbytes()), 0);
  EXPECT_EQ(std::memcmp(loaded.at("f").raw(), f.raw(), f.nbytes()), 0);
}

}  // namespace
}  // namespace accrue::testing
