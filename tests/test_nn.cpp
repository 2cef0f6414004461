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
  arena.params().zero_();  // every parameter now reads zeros through the arena
  for (double v : mlp(x).to_vector<double>()) EXPECT_EQ(v, 0.0);
  clear_tape();
}

}  // namespace
}  // namespace accrue::testing
