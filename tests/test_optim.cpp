// Optimizers against hand-computed steps and against a plain, unfused reference written from
// PyTorch's documented algorithms; clipping; the non-finite skip.
#include "test_util.h"

namespace accrue::testing {
namespace {

// A module with one parameter vector, for optimizer tests.
struct Vec : nn::Module {
  explicit Vec(std::vector<double> values) {
    register_parameter("p", Tensor::from_vector<double>({int64_t(values.size())}, values));
  }
  Tensor forward(const Tensor& x) override { return x; }
};

void set_grad(optim::ParameterArena& arena, const std::vector<double>& g) {
  arena.entries()[0].param.grad().copy_(Tensor::from_vector<double>({int64_t(g.size())}, g));
}

std::vector<double> values(optim::ParameterArena& arena) {
  return arena.entries()[0].param.to_vector<double>();
}

TEST(Adam, HandComputedSteps) {
  Vec model({1.0});
  optim::ParameterArena arena(model);
  optim::AdamOptions o;
  o.lr = 0.1;
  optim::Adam adam(arena, o);
  // With a constant gradient, bias-corrected m_hat / sqrt(v_hat) = 1: each step moves by lr.
  for (int step = 1; step <= 3; ++step) {
    set_grad(arena, {0.5});
    adam.step();
    EXPECT_NEAR(values(arena)[0], 1.0 - 0.1 * step, 1e-7) << "step " << step;
    EXPECT_EQ(arena.grads().to_vector<double>()[0], 0.0) << "the step zeroes the gradient";
  }
  EXPECT_EQ(adam.applied_steps(), 3);
  // m after three steps of g = 0.5: 0.5 * (1 - 0.9^3)
  EXPECT_NEAR(adam.exp_avg().to_vector<double>()[0], 0.5 * (1 - 0.729), 1e-12);
}

// A checkpoint's optimizer state is checked whole before any of it is copied: a refused state
// (a tensor of the wrong shape, a loss scaler no run could have written) leaves the optimizer as
// it was, and the message names what was wrong.
TEST(Adam, ARefusedStateChangesNothing) {
  Vec model({1.0, 2.0});
  optim::ParameterArena arena(model);
  optim::Adam trained(arena, {});
  trained.set_loss_scaling({}, 1024);
  set_grad(arena, {0.5, -0.5});
  trained.step();
  std::map<std::string, Tensor> good;
  for (const auto& [name, t] : trained.save_state()) good[name] = t.clone();

  Vec other_model({1.0, 2.0});
  optim::ParameterArena other_arena(other_model);
  optim::Adam fresh(other_arena, {});
  fresh.set_loss_scaling({}, 1024);
  const auto unchanged = [&] {
    EXPECT_EQ(fresh.exp_avg().to_vector<double>(),
              std::vector<double>(static_cast<size_t>(other_arena.size()), 0.0));
    EXPECT_EQ(fresh.applied_steps(), 0);
    EXPECT_EQ(fresh.scaler_state(), (std::pair<double, double>{1024, 0}));
  };
  std::map<std::string, Tensor> bad = good;
  bad["exp_avg_sq"] = Tensor::zeros({3}, DType::kFloat64);
  expect_error<ValueError>(
      [&] { fresh.load_state(bad); },
      {"'exp_avg_sq'", "float64[3]", str_cat("expects float64[", other_arena.size(), "]")});
  unchanged();
  for (const std::vector<double>& scaler : std::vector<std::vector<double>>{
           {0, 0}, {-8, 0}, {INFINITY, 0}, {NAN, 0}, {8, -1}, {8, 2.5}, {8, 1 << 25}}) {
    bad = good;
    bad["scaler"] = Tensor::from_vector<double>({2}, scaler);
    expect_error<ValueError>([&] { fresh.load_state(bad); },
                             {"loss scaler holds scale", "finite and > 0", "[0, 2^24]"});
    unchanged();
  }
  fresh.load_state(good);
  EXPECT_EQ(fresh.exp_avg().to_vector<double>(), trained.exp_avg().to_vector<double>());
  EXPECT_EQ(fresh.applied_steps(), 1);
}

TEST(Sgd, HandComputedMomentumSteps) {
  Vec model({1.0});
  optim::ParameterArena arena(model);
  optim::SgdOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  optim::SGD sgd(arena, o);
  set_grad(arena, {1.0});
  sgd.step();  // buf = 1, p = 1 - 0.1
  EXPECT_NEAR(values(arena)[0], 0.9, 1e-12);
  set_grad(arena, {1.0});
  sgd.step();  // buf = 1.9, p = 0.9 - 0.19
  EXPECT_NEAR(values(arena)[0], 0.71, 1e-12);
}

// PyTorch's algorithms, unfused, in double: the reference for the fused passes.
struct Reference {
  std::vector<double> p, m, v;
  int64_t t = 0;
  void adam(const std::vector<double>& g, double lr, double b1, double b2, double eps, double wd,
            bool decoupled) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      double gi = g[i];
      if (decoupled) {
        p[i] *= 1 - lr * wd;
      } else {
        gi += wd * p[i];
      }
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
  void sgd(const std::vector<double>& g, double lr, double mom, double damp, double wd,
           bool nesterov) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      double gi = g[i] + wd * p[i];
      m[i] = t == 1 ? gi : mom * m[i] + (1 - damp) * gi;
      gi = nesterov ? gi + mom * m[i] : m[i];
      p[i] -= lr * gi;
    }
  }
};

// Unfused clip: norm, then scale (PyTorch's clip_grad_norm_ coefficient).
std::vector<double> clipped(std::vector<double> g, double max_norm) {
  double sq = 0;
  for (double x : g) sq += x * x;
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    for (double& x : g) x *= max_norm / (norm + 1e-6);
  }
  return g;
}

enum class Kind { kAdam, kAdamW, kSgd, kSgdNesterov };

void check_against_reference(Kind kind, double max_norm) {
  const int n = 37;
  std::vector<double> init = as_doubles(random({n}, 5));
  Vec model(init);
  optim::ParameterArena arena(model);
  std::unique_ptr<optim::Optimizer> opt;
  optim::AdamOptions ao;
  ao.lr = 0.01;
  ao.weight_decay = 0.1;
  optim::SgdOptions so;
  so.lr = 0.05;
  so.momentum = 0.8;
  so.weight_decay = 0.01;
  so.nesterov = kind == Kind::kSgdNesterov;
  so.dampening = kind == Kind::kSgd ? 0.1 : 0.0;
  if (kind == Kind::kAdam) opt = std::make_unique<optim::Adam>(arena, ao);
  if (kind == Kind::kAdamW) opt = std::make_unique<optim::AdamW>(arena, ao);
  if (kind == Kind::kSgd || kind == Kind::kSgdNesterov)
    opt = std::make_unique<optim::SGD>(arena, so);
  Reference ref{init, std::vector<double>(n), std::vector<double>(n)};
  for (int step = 0; step < 6; ++step) {
    std::vector<double> g = as_doubles(random({n}, 100 + step, DType::kFloat64, -3, 3));
    set_grad(arena, g);
    opt->step(max_norm);
    const std::vector<double> gc = clipped(g, max_norm);
    if (kind == Kind::kAdam || kind == Kind::kAdamW) {
      ref.adam(gc, ao.lr, ao.beta1, ao.beta2, ao.eps, ao.weight_decay, kind == Kind::kAdamW);
    } else {
      ref.sgd(gc, so.lr, so.momentum, so.dampening, so.weight_decay, so.nesterov);
    }
    const auto got = values(arena);
    for (int i = 0; i < n; ++i) ASSERT_NEAR(got[i], ref.p[i], 1e-12) << "step " << step;
    double sq = 0;
    for (double x : g) sq += x * x;
    EXPECT_NEAR(opt->report().grad_norm, std::sqrt(sq), 1e-9);
  }
}

// The fused step against the reference over several steps, with and without clipping.
struct FusedCase {
  const char* name;
  Kind kind;
  double max_norm;  // 0: no clipping
};
void PrintTo(const FusedCase& c, std::ostream* out) {
  *out << c.name;
}

class FusedStep : public ::testing::TestWithParam<FusedCase> {};

TEST_P(FusedStep, MatchesReference) {
  check_against_reference(GetParam().kind, GetParam().max_norm);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, FusedStep,
                         ::testing::Values(FusedCase{"Adam", Kind::kAdam, 0.0},
                                           FusedCase{"AdamClipped", Kind::kAdam, 1.0},
                                           FusedCase{"AdamW", Kind::kAdamW, 0.0},
                                           FusedCase{"AdamWClipped", Kind::kAdamW, 2.0},
                                           FusedCase{"SgdMomentum", Kind::kSgd, 0.0},
                                           FusedCase{"SgdMomentumClipped", Kind::kSgd, 1.0},
                                           FusedCase{"SgdNesterov", Kind::kSgdNesterov, 0.0}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(FusedStepSkip, NonFiniteGradientSkipsTheUpdate) {
  for (double bad : {std::nan(""), double(INFINITY)}) {
    Vec model({1.0, 2.0});
    optim::ParameterArena arena(model);
    optim::Adam adam(arena);
    set_grad(arena, {0.5, bad});
    adam.step(1.0);
    EXPECT_TRUE(adam.report().skipped);
    EXPECT_EQ(values(arena), (std::vector<double>{1.0, 2.0}));
    EXPECT_EQ(adam.exp_avg().to_vector<double>()[0], 0.0);
    EXPECT_EQ(arena.grads().to_vector<double>()[1], 0.0) << "a skipped step still zeroes";
    EXPECT_EQ(adam.applied_steps(), 0);
    set_grad(arena, {0.5, 0.5});
    adam.step(1.0);
    EXPECT_FALSE(adam.report().skipped);
    EXPECT_EQ(adam.applied_steps(), 1);
  }
}

TEST(Arena, ParametersAndGradientsAreContiguousViews) {
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(3, 5));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::Linear>(5, 2));
  const std::vector<float> w0 = model.parameter("0.weight").to_vector<float>();
  optim::ParameterArena arena(model);
  ASSERT_EQ(arena.entries().size(), 4u);
  EXPECT_EQ(arena.entries()[0].name, "0.weight");
  EXPECT_EQ(arena.entries()[3].name, "2.bias");
  int64_t expected = 0;
  for (const auto& e : arena.entries()) {
    EXPECT_EQ(e.offset, expected);
    EXPECT_EQ(e.offset % optim::ParameterArena::kAlign, 0);
    EXPECT_EQ(e.param.raw(), static_cast<float*>(arena.masters().raw()) + e.offset) << e.name;
    EXPECT_EQ(e.param.grad().raw(), static_cast<float*>(arena.grads().raw()) + e.offset);
    expected += (e.param.numel() + 15) / 16 * 16;
  }
  EXPECT_EQ(arena.size(), expected);
  EXPECT_EQ(model.parameter("0.weight").to_vector<float>(), w0) << "values survive the move";
  Tensor x = random({4, 3}, 1, DType::kFloat32);
  backward(sum(model(x)));
  int nonzero = 0;
  for (float g : arena.grads().to_vector<float>()) nonzero += g != 0.0f;
  EXPECT_GT(nonzero, 10);
  arena.zero_grad();
  for (float g : arena.grads().to_vector<float>()) ASSERT_EQ(g, 0.0f);
}

}  // namespace
}  // namespace accrue::testing
