// Modules: PyTorch's names and layouts, initialisation bounds, seeded reproducibility, and
// moving parameters into the arena.
#include "test_util.h"

namespace accrue::testing {
namespace {

TEST(Modules, NamesAndLayoutsFollowPyTorch) {
  nn::Sequential seq;
  seq.add(std::make_shared<nn::Linear>(4, 3));
  seq.add(std::make_shared<nn::ReLU>());
  seq.add(std::make_shared<nn::Linear>(3, 2, /*bias=*/false));
  std::vector<std::string> names;
  for (auto& [name, t] : seq.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight"}));
  EXPECT_EQ(seq.parameter("0.weight").shape(), (Shape{3, 4}));
  EXPECT_EQ(seq.num_parameters(), 3 * 4 + 3 + 2 * 3);

  nn::MLP mlp({784, 512, 10});
  names.clear();
  for (auto& [name, t] : mlp.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                             "layers.1.bias"}));
  EXPECT_EQ(mlp.parameter("layers.1.weight").shape(), (Shape{10, 512}));
  for (auto& [name, t] : mlp.named_parameters()) EXPECT_TRUE(t.requires_grad()) << name;
}

TEST(Modules, LinearInitialisationMatchesPyTorchBounds) {
  nn::manual_seed(5);
  nn::Linear layer(400, 300);
  const double bound = 1.0 / std::sqrt(400.0);
  for (const Tensor& t : {layer.weight(), layer.bias()}) {
    const auto v = t.to_vector<float>();
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    EXPECT_GE(*lo, -bound);
    EXPECT_LT(*hi, bound);
    EXPECT_GT(*hi, 0.9 * bound) << "the draws should fill the interval";
  }
  nn::manual_seed(5);
  nn::Linear again(400, 300);
  EXPECT_EQ(again.weight().to_vector<float>(), layer.weight().to_vector<float>());
}

TEST(Modules, ForwardAfterArenaUsesArenaMemory) {
  nn::manual_seed(2);
  nn::MLP mlp({5, 4, 3}, nn::activation<nn::GELU>(), DType::kFloat64);
  Tensor x = random({2, 5}, 3);
  const auto before = mlp(x).to_vector<double>();
  clear_tape();
  optim::ParameterArena arena(mlp);
  const auto after = mlp(x).to_vector<double>();
  clear_tape();
  EXPECT_EQ(before, after);
  arena.masters().zero_();  // every parameter now reads zeros through the arena
  for (double v : mlp(x).to_vector<double>()) EXPECT_EQ(v, 0.0);
  clear_tape();
}

// MLP runs Linear + ReLU as the fused linear_relu op; the results must be the two ops' to the bit,
// forward and every gradient, in float32 and float64, at a micro-batch size that goes through
// the CPU's blocked GEMM.
TEST(Modules, FusedLinearReluGivesTheUnfusedResultsBitwise) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    nn::manual_seed(7);
    nn::MLP mlp({96, 80, 48, 10}, nn::activation<nn::ReLU>(), dtype);
    std::vector<Tensor> leaves;
    for (auto& [name, p] : mlp.named_parameters()) {
      leaves.push_back(p.clone());
      leaves.back().set_requires_grad(true);
    }
    const Tensor x = random({32, 96}, 3, dtype);
    std::vector<int32_t> labels;
    for (int i = 0; i < 32; ++i) labels.push_back(i % 10);
    const Tensor y = Tensor::from_vector<int32_t>({32}, labels);

    const Tensor fused_logits = mlp(x);
    backward(cross_entropy(fused_logits, y));
    Tensor h = x;
    for (size_t i = 0; i < 3; ++i) {
      h = linear(h, leaves[2 * i], leaves[2 * i + 1]);
      if (i < 2) h = relu(h);
    }
    backward(cross_entropy(h, y));

    EXPECT_EQ(as_doubles(fused_logits), as_doubles(h)) << dtype_name(dtype);
    size_t i = 0;
    for (auto& [name, p] : mlp.named_parameters()) {
      EXPECT_EQ(as_doubles(p.grad()), as_doubles(leaves[i++].grad()))
          << name << " " << dtype_name(dtype);
    }
  }
}

}  // namespace
}  // namespace accrue::testing
