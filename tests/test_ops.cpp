// The op table: every differentiable op, checked against central finite differences in float64
// on the CPU reference backend, then run in float32 on every other device present and compared
// with the CPU result (forward values and gradients).
#include <memory>

#include "test_util.h"

namespace accrue::testing {
namespace {

using Inputs = std::vector<Tensor>;

struct OpCase {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Tensor(const Inputs&)> f;  // any output shape
};

// Fixed random weights turn any output into a scalar whose gradient reaches every element.
Tensor weighted_sum(const Tensor& out) {
  if (out.numel() == 1) return reshape(out, {});
  Tensor w = random(out.shape(), 99, out.dtype()).to(out.device());
  return sum(mul(out, w));
}

Tensor labels_for(int64_t rows, int64_t classes, Device device) {
  std::vector<int32_t> l;
  for (int64_t i = 0; i < rows; ++i) l.push_back(static_cast<int32_t>((i * 7 + 3) % classes));
  return Tensor::from_vector<int32_t>({rows}, l, device);
}

std::vector<OpCase> op_table() {
  return {
      {"add", {{3, 4}, {3, 4}}, [](const Inputs& x) { return add(x[0], x[1]); }},
      {"sub", {{3, 4}, {3, 4}}, [](const Inputs& x) { return sub(x[0], x[1]); }},
      {"mul", {{3, 4}, {3, 4}}, [](const Inputs& x) { return mul(x[0], x[1]); }},
      {"mul_self", {{5}}, [](const Inputs& x) { return mul(x[0], x[0]); }},
      {"add_self", {{5}}, [](const Inputs& x) { return add(x[0], x[0]); }},
      {"scale", {{2, 3}}, [](const Inputs& x) { return scale(x[0], -2.5); }},
      {"relu", {{4, 5}}, [](const Inputs& x) { return relu(x[0]); }},
      {"tanh", {{4, 5}}, [](const Inputs& x) { return accrue::tanh(x[0]); }},
      {"gelu", {{4, 5}}, [](const Inputs& x) { return gelu(scale(x[0], 3.0)); }},
      {"matmul", {{3, 5}, {5, 4}}, [](const Inputs& x) { return matmul(x[0], x[1]); }},
      {"bias_add", {{3, 4}, {4}}, [](const Inputs& x) { return bias_add(x[0], x[1]); }},
      {"linear", {{3, 5}, {4, 5}, {4}}, [](const Inputs& x) { return linear(x[0], x[1], x[2]); }},
      {"linear_no_bias",
       {{3, 5}, {4, 5}},
       [](const Inputs& x) { return linear(x[0], x[1], Tensor()); }},
      {"sum", {{3, 4}}, [](const Inputs& x) { return sum(x[0]); }},
      {"mean", {{3, 4}}, [](const Inputs& x) { return mean(x[0]); }},
      {"log_softmax", {{3, 6}}, [](const Inputs& x) { return log_softmax(scale(x[0], 4.0)); }},
      {"cross_entropy_sum",
       {{5, 4}},
       [](const Inputs& x) {
         return cross_entropy(scale(x[0], 3.0), labels_for(5, 4, x[0].device()));
       }},
      {"cross_entropy_mean",
       {{5, 4}},
       [](const Inputs& x) {
         return cross_entropy(x[0], labels_for(5, 4, x[0].device()), Reduction::kMean);
       }},
      {"reshape",
       {{3, 4}},
       [](const Inputs& x) {
         return reshape(x[0], {2, 6});
       }},
      {"mlp",
       {{6, 5}, {8, 5}, {8}, {3, 8}, {3}},
       [](const Inputs& x) {
         Tensor h = accrue::tanh(linear(x[0], x[1], x[2]));
         return cross_entropy(linear(h, x[3], x[4]), labels_for(6, 3, x[0].device()));
       }},
  };
}

void PrintTo(const OpCase& c, std::ostream* out) {
  *out << c.name;
}

class OpTable : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpTable, GradientMatchesFiniteDifferencesInFloat64) {
  const OpCase& c = GetParam();
  Inputs inputs;
  for (size_t i = 0; i < c.shapes.size(); ++i) inputs.push_back(random(c.shapes[i], 17 + i));
  const double err = gradcheck([&](const Inputs& x) { return weighted_sum(c.f(x)); }, inputs);
  EXPECT_LT(err, 1e-6) << c.name;
  EXPECT_EQ(tape_size(), 0u);
}

TEST_P(OpTable, EveryDeviceMatchesCpu) {
  const OpCase& c = GetParam();
  auto run = [&](Device device) {
    Inputs inputs;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      Tensor t = random(c.shapes[i], 17 + i, DType::kFloat32).to(device);
      t.set_requires_grad(true);
      inputs.push_back(t);
    }
    Tensor out = c.f(inputs);
    Tensor forward = out.clone();
    weighted_sum(out).backward();
    Inputs results{forward};
    for (auto& t : inputs) results.push_back(t.grad());
    return results;
  };
  const Inputs reference = run(Device::cpu());
  int compared = 0;
  for (Device device : devices()) {
    if (device.is_cpu()) continue;
    const Inputs got = run(device);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LT(max_rel_error(got[i], reference[i]), 1e-5)
          << c.name << " on " << device.str() << (i == 0 ? " forward" : " gradient");
    }
    ++compared;
  }
  if (compared == 0) GTEST_SKIP() << "no device besides the CPU: " << cuda_unavailable_reason();
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable, ::testing::ValuesIn(op_table()),
                         [](const auto& info) { return info.param.name; });

TEST(Ops, ForwardValuesOnKnownInputs) {
  Tensor x = Tensor::from_vector<double>({2, 3}, {1, -2, 3, 0, 0.5, -1});
  EXPECT_EQ(relu(x).to_vector<double>(), (std::vector<double>{1, 0, 3, 0, 0.5, 0}));
  EXPECT_DOUBLE_EQ(sum(x).item(), 1.5);
  EXPECT_DOUBLE_EQ(mean(x).item(), 0.25);
  Tensor w = Tensor::from_vector<double>({2, 3}, {1, 0, 0, 0, 1, 1});
  Tensor b = Tensor::from_vector<double>({2}, {10, 20});
  EXPECT_EQ(linear(x, w, b).to_vector<double>(), (std::vector<double>{11, 21, 10, 19.5}));
  EXPECT_NEAR(gelu(Tensor::scalar(1.0, DType::kFloat64)).item(), 0.8413447460685429, 1e-12);
  // softmax cross-entropy of uniform logits over 4 classes is log(4) per row.
  Tensor logits = Tensor::zeros({3, 4}, DType::kFloat64);
  Tensor labels = Tensor::from_vector<int32_t>({3}, {0, 1, 3});
  EXPECT_NEAR(cross_entropy(logits, labels).item(), 3 * std::log(4.0), 1e-12);
  EXPECT_NEAR(cross_entropy(logits, labels, Reduction::kMean).item(), std::log(4.0), 1e-12);
  Tensor scores = Tensor::from_vector<float>({2, 3}, {0.1f, 0.7f, 0.2f, 0.9f, 0.05f, 0.05f});
  EXPECT_EQ(argmax(scores).to_vector<int32_t>(), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(count_equal(argmax(scores), Tensor::from_vector<int32_t>({2}, {1, 2})), 1);
}

// Parameter gradients accumulate in place across backward calls: three identical backward
// passes leave exactly three times one pass, on every device.
TEST(Ops, LeafGradientsAccumulateAcrossBackwardCalls) {
  for (Device device : devices()) {
    Tensor x = random({4, 3}, 1, DType::kFloat32).to(device);
    Tensor w = random({2, 3}, 2, DType::kFloat32).to(device);
    Tensor b = random({2}, 3, DType::kFloat32).to(device);
    w.set_requires_grad(true);
    b.set_requires_grad(true);
    Tensor labels = Tensor::from_vector<int32_t>({4}, {0, 1, 1, 0}, device);
    cross_entropy(linear(x, w, b), labels).backward();
    const Tensor w_once = w.grad().clone(), b_once = b.grad().clone();
    const void* buffer = w.grad().raw();
    for (int i = 0; i < 2; ++i) cross_entropy(linear(x, w, b), labels).backward();
    EXPECT_EQ(w.grad().raw(), buffer) << "the gradient buffer must be reused in place";
    EXPECT_LT(max_rel_error(w.grad(), scale(w_once, 3.0)), 1e-6) << device.str();
    EXPECT_LT(max_rel_error(b.grad(), scale(b_once, 3.0)), 1e-6) << device.str();
  }
}

}  // namespace
}  // namespace accrue::testing
