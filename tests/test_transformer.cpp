// The GPT of nn/transformer.h: nanoGPT's names, layouts and initialisation; the whole block's and
// the whole model's gradients against directional central differences in float64 (one
// direction through every parameter at once, so CI stays fast); the tied matrix's gradient as
// the sum of its two uses; causality (a later token never changes an earlier logit).
#include <cmath>

#include "kernels/functors.h"
#include "nn/transformer.h"
#include "ops/ops.h"

#include "test_util.h"

namespace accrue::testing {
namespace {

nn::GPTConfig tiny_config() {
  nn::GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 9;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

Tensor tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < b * t; ++i) v.push_back(static_cast<int32_t>((i * 7 + seed) % vocab));
  return Tensor::from_vector<int32_t>({b, t}, v);
}

TEST(Transformer, NamesLayoutsAndInitialisationFollowNanoGPT) {
  nn::manual_seed(3);
  const nn::GPTConfig c = tiny_config();
  nn::GPT gpt(c, DType::kFloat64);
  std::vector<std::string> expected{"transformer.wte.weight [11, 8]",
                                    "transformer.wpe.weight [9, 8]"};
  for (int i = 0; i < 2; ++i) {
    const std::string h = str_cat("transformer.h.", i, ".");
    for (const char* entry :
         {"ln_1.weight [8]", "ln_1.bias [8]", "attn.c_attn.weight [24, 8]", "attn.c_attn.bias [24]",
          "attn.c_proj.weight [8, 8]", "attn.c_proj.bias [8]", "ln_2.weight [8]", "ln_2.bias [8]",
          "mlp.c_fc.weight [32, 8]", "mlp.c_fc.bias [32]", "mlp.c_proj.weight [8, 32]",
          "mlp.c_proj.bias [8]"}) {
      expected.push_back(h + entry);
    }
  }
  expected.push_back("transformer.ln_f.weight [8]");
  expected.push_back("transformer.ln_f.bias [8]");
  std::vector<std::string> got;
  for (const auto& [name, t] : gpt.named_parameters())
    got.push_back(name + " " + shape_str(t.shape()));
  EXPECT_EQ(got, expected);  // the tied head is not a parameter of its own

  for (const auto& [name, t] : gpt.named_parameters()) {
    const std::vector<double> v = t.to_vector<double>();
    double sum = 0, sq = 0;
    for (double x : v) sum += x, sq += x * x;
    const double n = static_cast<double>(v.size()), mean = sum / n;
    if (name.find(".ln_") != std::string::npos) {
      EXPECT_EQ(mean, name.find("weight") != std::string::npos ? 1.0 : 0.0) << name;
    } else if (name.find(".bias") != std::string::npos) {
      EXPECT_EQ(sq, 0.0) << name;
    } else {
      const double std = name.find("c_proj.weight") != std::string::npos ? 0.02 / 2.0 : 0.02;
      EXPECT_NEAR(std::sqrt(sq / n), std, std * (n < 100 ? 0.5 : 0.25)) << name;
    }
  }
}

// f(theta + e u) for every parameter and u a fixed random direction: the directional derivative
// from central differences against <grad f, u> from backward. u's entries are O(1) against
// weights of O(0.02), so the difference's truncation error (e^2) dominates above e = 1e-6.
double directional_error(nn::Module& model, const std::function<Tensor()>& loss,
                         double eps = 1e-6) {
  std::vector<Tensor> params = model.parameters(), directions;
  for (size_t i = 0; i < params.size(); ++i) {
    directions.push_back(random(params[i].shape(), 100 + i));
  }
  backward(loss());
  double analytic = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto g = params[i].grad().to_vector<double>(), u = directions[i].to_vector<double>();
    for (size_t j = 0; j < g.size(); ++j) analytic += g[j] * u[j];
  }

  const auto shifted = [&](double e) {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      double* p = params[i].data<double>();
      const auto u = directions[i].to_vector<double>();
      for (size_t j = 0; j < u.size(); ++j) p[j] += e * u[j];
    }
    const double value = loss().item();
    for (size_t i = 0; i < params.size(); ++i) {
      double* p = params[i].data<double>();
      const auto u = directions[i].to_vector<double>();
      for (size_t j = 0; j < u.size(); ++j) p[j] -= e * u[j];
    }
    return value;
  };
  const double numeric = (shifted(eps) - shifted(-eps)) / (2 * eps);
  return std::abs(numeric - analytic) / std::max(1.0, std::abs(numeric));
}

TEST(Transformer, BlockGradientMatchesDirectionalDifferences) {
  nn::manual_seed(5);
  nn::Block block(tiny_config(), DType::kFloat64);
  Tensor x = random({2, 5, 8}, 7);
  x.set_requires_grad(true);
  const Tensor w = random({2, 5, 8}, 8);
  EXPECT_LT(directional_error(block, [&] { return sum(mul(block(x), w)); }), 1e-7);
  // and the input's gradient, element by element
  EXPECT_LT(gradcheck([&](const std::vector<Tensor>& in) { return sum(mul(block(in[0]), w)); },
                      {random({2, 5, 8}, 9)}),
            1e-7);
}

TEST(Transformer, ModelGradientMatchesDirectionalDifferences) {
  nn::manual_seed(6);
  const nn::GPTConfig c = tiny_config();
  nn::GPT gpt(c, DType::kFloat64);
  const Tensor idx = tokens(3, 7, c.vocab_size, 2);
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < 21; ++i) labels.push_back(i % 4 == 0 ? kIgnoreLabel : (i * 3) % 11);
  const Tensor target = Tensor::from_vector<int32_t>({21}, labels);
  EXPECT_LT(directional_error(gpt, [&] { return cross_entropy(gpt(idx), target); }), 1e-7);
}

// The tied matrix's gradient is the sum of what its two uses would get as separate matrices.
TEST(Transformer, TiedGradientIsTheSumOfBothUses) {
  const Tensor idx = Tensor::from_vector<int32_t>({6}, {1, 4, 1, 0, 3, 4});
  const Tensor labels = Tensor::from_vector<int32_t>({6}, {2, 0, 4, 4, kIgnoreLabel, 1});
  const auto loss = [&](const Tensor& table, const Tensor& head) {
    return cross_entropy(linear(accrue::tanh(embedding(table, idx)), head, Tensor()), labels);
  };
  Tensor tied = random({5, 3}, 1);
  tied.set_requires_grad(true);
  backward(loss(tied, tied));
  Tensor table = random({5, 3}, 1), head = random({5, 3}, 1);
  table.set_requires_grad(true);
  head.set_requires_grad(true);
  backward(loss(table, head));
  const Tensor both = add(table.grad(), head.grad());
  EXPECT_LT(max_rel_error(tied.grad(), both), 1e-15);
  EXPECT_GT(max_rel_error(table.grad(), both), 1e-3);  // each use alone is not the whole story
}

TEST(Transformer, LaterTokensNeverChangeEarlierLogits) {
  nn::manual_seed(8);
  const nn::GPTConfig c = tiny_config();
  nn::GPT gpt(c, DType::kFloat64);
  NoGradGuard no_grad;
  const Tensor a = gpt(Tensor::from_vector<int32_t>({1, 6}, {1, 2, 3, 4, 5, 6}));
  const Tensor b = gpt(Tensor::from_vector<int32_t>({1, 6}, {1, 2, 3, 9, 9, 9}));
  const Tensor short_run = gpt(Tensor::from_vector<int32_t>({1, 3}, {1, 2, 3}));
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>(),
             vs = short_run.to_vector<double>();
  for (size_t i = 0; i < 3 * 11; ++i) {
    EXPECT_EQ(va[i], vb[i]) << i;
    EXPECT_NEAR(va[i], vs[i], 1e-12) << i;
  }
  EXPECT_NE(va[3 * 11], vb[3 * 11]);
}

// Decoding with the cache: a prompt of 3 tokens, then one token a step, then a step that starts
// two positions before the cache's end (a row whose padding became a token) with those
// positions changed: every step's logits equal forward() over the whole prefix (1e-12 in
// float64: the products have other shapes), on every device, and the cache does not record.
TEST(Transformer, CachedDecodingGivesTheWholePrefixsLogits) {
  nn::manual_seed(9);
  const nn::GPTConfig c = tiny_config();
  for (Device device : devices()) {
    nn::GPT gpt(c, DType::kFloat64);
    gpt.to(device);
    std::vector<int32_t> seq{1, 2, 3, 4, 5, 6, 7, 8, 9}, other{1, 2, 3, 4, 5, 10, 10, 2, 5};
    const int64_t b = 2;
    nn::KVCache cache = gpt.make_cache(b, device);
    // (start, end) of each step; the step at 5 rewrites positions 5 and 6 with `other`'s tokens
    const std::vector<std::pair<int64_t, int64_t>> steps{{0, 3}, {3, 4}, {4, 5},
                                                         {5, 7}, {5, 8}, {8, 9}};
    for (size_t s = 0; s < steps.size(); ++s) {
      const auto [start, end] = steps[s];
      const std::vector<int32_t>& row = s >= 4 ? other : seq;
      std::vector<int32_t> whole, part;
      for (int64_t i = 0; i < b; ++i) {
        whole.insert(whole.end(), row.begin(), row.begin() + end);
        part.insert(part.end(), row.begin() + start, row.begin() + end);
      }
      const Tensor cached = gpt.forward_cached(
          Tensor::from_vector<int32_t>({b, end - start}, part, device), start, cache);
      EXPECT_FALSE(cached.requires_grad());
      Tensor reference;
      {
        NoGradGuard no_grad;
        reference = gpt(Tensor::from_vector<int32_t>({b, end}, whole, device));
      }
      const auto got = cached.to(Device::cpu()).to_vector<double>();
      const auto want = reference.to(Device::cpu()).to_vector<double>();
      const int64_t v = c.vocab_size;
      ASSERT_EQ(static_cast<int64_t>(got.size()), b * (end - start) * v);
      for (int64_t i = 0; i < b; ++i) {
        for (int64_t p = start; p < end; ++p) {
          for (int64_t k = 0; k < v; ++k) {
            EXPECT_NEAR(got[static_cast<size_t>((i * (end - start) + p - start) * v + k)],
                        want[static_cast<size_t>((i * end + p) * v + k)], 1e-12)
                << device.str() << " step " << s << " row " << i << " position " << p;
          }
        }
      }
    }
    expect_error<ShapeError>(
        [&] {
          gpt.forward_cached(Tensor::from_vector<int32_t>({b, 2}, {1, 2, 3, 4}, device), 8, cache);
        },
        {"forward_cached", "[2, T]", "start 8", "context of 9"});
    expect_error<ShapeError>(
        [&] {
          gpt.forward_cached(Tensor::from_vector<int32_t>({1, 1}, {1}, device), 0, cache);
        },
        {"forward_cached", "[2, T]", "[1, 1]"});
  }
}

// GELU's float32 exp and erf (kernels/functors.h) against float64's, over every input a GELU
// meets: relative error of exp ~1e-7 in its normal range, absolute error of erf <= 1.5e-7 (plus
// 3e-7 of float rounding); the clamps give the limits far out.
TEST(Transformer, VectorisableExpAndErfStayWithinTheirBounds) {
  double worst_exp = 0, worst_erf = 0;
  for (double x = -87.0; x <= 88.37; x += 1.0 / 1024) {
    const double e = std::exp(static_cast<double>(static_cast<float>(x)));
    worst_exp = std::max(worst_exp, std::abs(fn::exp_approx(static_cast<float>(x)) - e) / e);
  }
  for (double x = -12.0; x <= 12.0; x += 1.0 / 4096) {
    const float xf = static_cast<float>(x);
    worst_erf = std::max(worst_erf, std::abs(fn::erf_approx(xf) - std::erf(double(xf))));
  }
  EXPECT_LT(worst_exp, 3e-7);
  EXPECT_LT(worst_erf, 5e-7);
  EXPECT_EQ(fn::exp_approx(-1000.0f), fn::exp_approx(-87.3f));
  EXPECT_LT(fn::exp_approx(-1000.0f), 1e-37f);
  // Past the clamp the result stays finite (88.7 once rounded n to 128: the exponent of inf).
  for (float x : {88.38f, 88.7f, 88.72f, 1000.0f}) {
    EXPECT_EQ(fn::exp_approx(x), fn::exp_approx(88.37f)) << x;
  }
  EXPECT_TRUE(std::isfinite(fn::exp_approx(88.37f)));
  EXPECT_EQ(fn::erf_approx(30.0f), 1.0f);
  EXPECT_EQ(fn::erf_approx(-30.0f), -1.0f);
  EXPECT_EQ(fn::erf_approx(0.0f), 0.0f);
}

// bmm with an empty inner dimension: zeros (BLAS needs leading dimensions of at least 1).
TEST(Transformer, BmmOfAnEmptyInnerDimensionIsZeros) {
  for (Device device : devices()) {
    const Tensor a = Tensor::zeros({2, 3, 0}, DType::kFloat32, device);
    const Tensor b = Tensor::zeros({2, 0, 4}, DType::kFloat32, device);
    const Tensor y = bmm(a, b).to(Device::cpu());
    EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
    for (float v : y.to_vector<float>()) EXPECT_EQ(v, 0.0f) << device.str();
  }
}

TEST(Transformer, BadShapesAreNamed) {
  const nn::GPTConfig c = tiny_config();
  nn::GPT gpt(c);
  expect_error<ShapeError>([&] { gpt(tokens(1, 10, 11, 0)); }, {"[GPT]", "T <= 9", "[1, 10]"});
  nn::GPTConfig odd = c;
  odd.n_head = 3;
  expect_error<ValueError>([&] { nn::GPT bad(odd); }, {"[GPT]", "n_head 3", "n_embd 8"});
}

}  // namespace
}  // namespace accrue::testing
