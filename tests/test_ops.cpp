// The op table: every differentiable op, checked against central finite differences in float64
// on the CPU reference backend, then run in float32 on every other device present and compared
// with the CPU result (forward values and gradients), and in bfloat16 and float16 on every
// device, compared with float64 on the same rounded inputs, with a tolerance derived from the
// format's epsilon.
#include <cmath>
#include <memory>
#include <random>

#include "core/threads.h"
#include "kernels/backend.h"
#include "kernels/functors.h"

#include "test_util.h"

namespace accrue::testing {
namespace {

using Inputs = std::vector<Tensor>;

// The sizes every op runs at: rows x cols of its main input. Together they reach every code
// path: the serial CPU loop, a tail that no 4-wide vector covers (4k + 3), the OpenMP loops
// (above kParallelGrain = 32768 elements), several CUDA blocks in every reduction (rows > 8
// warps-per-row blocks, columns > 256 threads, elements > 256 per grid-stride pass), and inputs
// that start off any vector alignment (views one row into a larger buffer, odd row length).
struct Size {
  const char* name;
  int64_t rows, cols;
  bool misaligned;
  int64_t probes;  // finite-difference probes per input (0: every element)
  // The finite-difference step. Large inputs make the weighted sum large, and the difference
  // quotient's rounding error grows as |f| * 1e-16 / eps: a larger step keeps it near 1e-8.
  double eps;
};
const Size kSizes[] = {
    {"tiny", 3, 4, false, 0, 1e-6},
    {"odd_tail", 5, 7, false, 0, 1e-6},           // 35 = 4 * 8 + 3
    {"parallel", 64, 515, false, 16, 1e-5},       // 32960 elements
    {"multi_block", 300, 1031, false, 12, 1e-5},  // 309300 elements
    {"misaligned", 9, 11, true, 0, 1e-6},
};

struct OpCase {
  std::string name;
  std::function<std::vector<Shape>(int64_t rows, int64_t cols)> shapes;
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

using Dims = std::vector<Shape>;

// Input shapes of a case from the size's rows and columns.
Dims one_matrix(int64_t r, int64_t c) {
  return {{r, c}};
}
Dims two_matrices(int64_t r, int64_t c) {
  return {{r, c}, {r, c}};
}
Dims attention_scores(int64_t, int64_t c) {  // [B, T, T] with T from the size's columns
  return {{2, c, c}};
}
// [B, T, L]: the last T of L positions query (a decoder's new tokens after cached ones)
Dims cached_attention_scores(int64_t, int64_t c) {
  return {{2, (c + 1) / 2, c}};
}
Dims head_split_shapes(int64_t r, int64_t c) {
  return {{2, r, 2, c}};
}
Dims one_vector(int64_t r, int64_t c) {
  return {{r * c}};
}
Dims matmul_shapes(int64_t r, int64_t c) {
  return {{r, c}, {c, 5}};
}
Dims bias_shapes(int64_t r, int64_t c) {
  return {{r, c}, {c}};
}
Dims linear_shapes(int64_t r, int64_t c) {
  return {{r, c}, {6, c}, {6}};
}
Dims linear_no_bias_shapes(int64_t r, int64_t c) {
  return {{r, c}, {6, c}};
}
Dims linear_wide_shapes(int64_t r, int64_t c) {
  return {{r, 6}, {c, 6}, {c}};
}
Dims mlp_shapes(int64_t r, int64_t c) {
  return {{r, c}, {8, c}, {8}, {3, 8}, {3}};
}

// The NCHW ops' inputs grow with the size's rows and columns (past the CPU's parallel grain
// and several CUDA blocks at the large sizes) while the finite differences stay affordable.
int64_t image_h(int64_t r) {
  return 4 + r / 4;
}
int64_t image_w(int64_t c) {
  return 5 + c / 8;
}
Dims conv_shapes(int64_t r, int64_t c) {
  return {{2, 3, image_h(r), image_w(c)}, {4, 3, 3, 3}, {4}};
}
Dims conv_no_bias_shapes(int64_t r, int64_t c) {
  return {{2, 3, image_h(r), image_w(c)}, {4, 3, 3, 3}};
}
Dims image_shapes(int64_t r, int64_t c) {
  return {{2, 3, image_h(r), image_w(c)}};
}
Dims group_norm_shapes(int64_t r, int64_t c) {
  return {{2, 6, image_h(r), image_w(c)}, {6}, {6}};
}
Dims batch_norm_shapes(int64_t r, int64_t c) {
  return {{3, 4, image_h(r), image_w(c)}, {4}, {4}};
}
Dims layer_norm_shapes(int64_t r, int64_t c) {
  return {{r, c}, {c}, {c}};
}

// Running statistics for a batch-norm case: made afresh inside each call, in the dtype x's
// statistics are computed in (float32 beside a 16-bit x, as mixed precision keeps them).
Tensor running(int64_t channels, double value, const Tensor& like) {
  return full({channels}, value, compute_dtype(like.dtype()), like.device());
}

// Sample indices 0 .. N-1 for a dropout case.
Tensor sample_ids(const Tensor& x) {
  std::vector<int32_t> ids(static_cast<size_t>(x.size(0)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(5 * i + 1);
  return Tensor::from_vector<int32_t>({x.size(0)}, ids, x.device());
}

Tensor labels_of(const Tensor& logits) {
  return labels_for(logits.size(0), logits.size(1), logits.device());
}

// An index [2, rows] into a table of `rows` rows, every row used twice or more times over.
Tensor lookups_into(const Tensor& table) {
  const int64_t rows = table.size(0);
  std::vector<int32_t> l;
  for (int64_t i = 0; i < 2 * rows; ++i) l.push_back(static_cast<int32_t>((i * 5 + 1) % rows));
  return Tensor::from_vector<int32_t>({2, rows}, l, table.device());
}

// The same with every third row ignored (the padding of a batch of sequences).
Tensor labels_with_ignored(const Tensor& logits) {
  std::vector<int32_t> l = labels_of(logits).to(Device::cpu()).to_vector<int32_t>();
  for (size_t i = 0; i < l.size(); i += 3) l[i] = kIgnoreLabel;
  return Tensor::from_vector<int32_t>({logits.size(0)}, l, logits.device());
}

std::vector<OpCase> op_table() {
  return {
      {"add", two_matrices, [](const Inputs& x) { return add(x[0], x[1]); }},
      {"sub", two_matrices, [](const Inputs& x) { return sub(x[0], x[1]); }},
      {"mul", two_matrices, [](const Inputs& x) { return mul(x[0], x[1]); }},
      {"mul_self", one_vector, [](const Inputs& x) { return mul(x[0], x[0]); }},
      {"add_self", one_vector, [](const Inputs& x) { return add(x[0], x[0]); }},
      {"scale", one_matrix, [](const Inputs& x) { return scale(x[0], -2.5); }},
      {"relu", one_matrix, [](const Inputs& x) { return relu(x[0]); }},
      {"tanh", one_matrix, [](const Inputs& x) { return accrue::tanh(x[0]); }},
      {"gelu", one_matrix, [](const Inputs& x) { return gelu(scale(x[0], 3.0)); }},
      {"sigmoid", one_matrix, [](const Inputs& x) { return sigmoid(scale(x[0], 30.0)); }},
      {"matmul", matmul_shapes, [](const Inputs& x) { return matmul(x[0], x[1]); }},
      {"bias_add", bias_shapes, [](const Inputs& x) { return bias_add(x[0], x[1]); }},
      {"linear", linear_shapes, [](const Inputs& x) { return linear(x[0], x[1], x[2]); }},
      {"linear_no_bias", linear_no_bias_shapes,
       [](const Inputs& x) { return linear(x[0], x[1], Tensor()); }},
      {"linear_wide", linear_wide_shapes, [](const Inputs& x) { return linear(x[0], x[1], x[2]); }},
      {"linear_relu", linear_shapes, [](const Inputs& x) { return linear_relu(x[0], x[1], x[2]); }},
      {"linear_relu_no_bias", linear_no_bias_shapes,
       [](const Inputs& x) { return linear_relu(x[0], x[1], Tensor()); }},
      {"linear_relu_wide", linear_wide_shapes,
       [](const Inputs& x) { return linear_relu(x[0], x[1], x[2]); }},
      {"sum", one_matrix, [](const Inputs& x) { return sum(x[0]); }},
      {"mean", one_matrix, [](const Inputs& x) { return mean(x[0]); }},
      {"log_softmax", one_matrix, [](const Inputs& x) { return log_softmax(scale(x[0], 4.0)); }},
      {"cross_entropy_sum", one_matrix,
       [](const Inputs& x) { return cross_entropy(scale(x[0], 3.0), labels_of(x[0])); }},
      {"bmm", two_matrices,
       [](const Inputs& x) {
         const int64_t r = x[0].size(0), c = x[0].size(1);
         return bmm(reshape(x[0], {1, r, c}), reshape(x[1], {1, c, r}));
       }},
      {"bmm_transposed", two_matrices,
       [](const Inputs& x) {
         const int64_t r = x[0].size(0), c = x[0].size(1);
         return bmm(reshape(x[0], {r, 1, c}), reshape(x[1], {r, 1, c}), true);
       }},
      {"causal_softmax", attention_scores,
       [](const Inputs& x) { return causal_softmax(scale(x[0], 3.0), 0.5); }},
      {"causal_softmax_after_cached_keys", cached_attention_scores,
       [](const Inputs& x) { return causal_softmax(scale(x[0], 3.0), 0.5); }},
      {"permute", head_split_shapes,  // [B, T, 2, D] -> [2, B, T, D]
       [](const Inputs& x) {
         return permute(x[0], {2, 0, 1, 3});
       }},
      {"permute_transpose", one_matrix,
       [](const Inputs& x) {
         return permute(x[0], {1, 0});
       }},
      {"select", one_matrix,
       [](const Inputs& x) { return mul(select(x[0], 1), select(x[0], x[0].size(0) - 1)); }},
      {"embedding", one_matrix,
       [](const Inputs& x) { return embedding(x[0], lookups_into(x[0])); }},
      {"cross_entropy_ignoring", one_matrix,
       [](const Inputs& x) { return cross_entropy(scale(x[0], 3.0), labels_with_ignored(x[0])); }},
      {"cross_entropy_mean", one_matrix,
       [](const Inputs& x) { return cross_entropy(x[0], labels_of(x[0]), Reduction::kMean); }},
      {"reshape", one_matrix,
       [](const Inputs& x) {
         return reshape(x[0], {x[0].size(1), x[0].size(0)});
       }},
      {"conv2d", conv_shapes,
       [](const Inputs& x) {
         return conv2d(x[0], x[1], x[2], {1, 1, 1, 1, 1, 1});
       }},
      {"conv2d_strided_dilated", conv_shapes,
       [](const Inputs& x) {
         return conv2d(x[0], x[1], x[2], {2, 2, 2, 1, 2, 1});
       }},
      {"conv2d_no_bias", conv_no_bias_shapes,
       [](const Inputs& x) { return conv2d(x[0], x[1], Tensor()); }},
      {"max_pool2d", image_shapes, [](const Inputs& x) { return max_pool2d(x[0], {}); }},
      {"max_pool2d_padded", image_shapes,
       [](const Inputs& x) {
         return max_pool2d(x[0], {3, 3, 2, 2, 1, 1});
       }},
      {"max_pool2d_relu", image_shapes, [](const Inputs& x) { return max_pool2d_relu(x[0], {}); }},
      {"max_pool2d_relu_padded", image_shapes,
       [](const Inputs& x) {
         return max_pool2d_relu(x[0], {3, 3, 2, 2, 1, 1});
       }},
      {"avg_pool2d", image_shapes,
       [](const Inputs& x) {
         return avg_pool2d(x[0], {3, 3, 2, 2, 1, 1});
       }},
      {"flatten", image_shapes, [](const Inputs& x) { return flatten(x[0]); }},
      {"group_norm", group_norm_shapes,
       [](const Inputs& x) { return group_norm(x[0], 3, x[1], x[2]); }},
      {"group_norm_relu_max_pool2d", group_norm_shapes,
       [](const Inputs& x) { return group_norm_relu_max_pool2d(x[0], 3, x[1], x[2], {}); }},
      {"group_norm_relu_max_pool2d_padded", group_norm_shapes,
       [](const Inputs& x) {
         return group_norm_relu_max_pool2d(x[0], 2, x[1], x[2], {3, 3, 2, 2, 1, 1});
       }},
      {"layer_norm", layer_norm_shapes,
       [](const Inputs& x) { return layer_norm(x[0], x[1], x[2]); }},
      {"batch_norm_train", batch_norm_shapes,
       [](const Inputs& x) {
         return batch_norm(x[0], x[1], x[2], running(4, 0.0, x[0]), running(4, 1.0, x[0]), true);
       }},
      {"batch_norm_eval", batch_norm_shapes,
       [](const Inputs& x) {
         return batch_norm(x[0], x[1], x[2], running(4, 0.2, x[0]), running(4, 1.5, x[0]), false);
       }},
      {"dropout", one_matrix,
       [](const Inputs& x) {
         return dropout(x[0], {0.4, 99, 3}, sample_ids(x[0]));
       }},
      {"mlp", mlp_shapes,
       [](const Inputs& x) {
         Tensor h = accrue::tanh(linear(x[0], x[1], x[2]));
         return cross_entropy(linear(h, x[3], x[4]), labels_for(x[0].size(0), 3, x[0].device()));
       }},
  };
}

void PrintTo(const OpCase& c, std::ostream* out) {
  *out << c.name;
}
void PrintTo(const Size& s, std::ostream* out) {
  *out << s.name << " [" << s.rows << ", " << s.cols << "]";
}

using Param = std::tuple<OpCase, Size>;

// An input of the case's size: a fresh tensor, or a view one row into a larger one, so that its
// first element sits off every vector alignment (odd row lengths make the offset odd).
Tensor make_input(const Shape& shape, uint64_t seed, DType dtype, const Size& size, Device device) {
  if (!size.misaligned) return random(shape, seed, dtype).to(device);
  Shape padded = shape;
  padded[0] += 1;
  return random(padded, seed, dtype).to(device).narrow(1, shape[0]);
}

class OpTable : public ::testing::TestWithParam<Param> {};

TEST_P(OpTable, GradientMatchesFiniteDifferencesInFloat64) {
  const auto& [c, size] = GetParam();
  Inputs inputs;
  const Dims shapes = c.shapes(size.rows, size.cols);
  for (size_t i = 0; i < shapes.size(); ++i) {
    inputs.push_back(make_input(shapes[i], 17 + i, DType::kFloat64, size, Device::cpu()));
  }
  const double err = gradcheck([&](const Inputs& x) { return weighted_sum(c.f(x)); }, inputs,
                               size.eps, size.probes);
  EXPECT_LT(err, 1e-6) << c.name << " at " << size.name;
  EXPECT_EQ(tape_size(), 0u);
}

TEST_P(OpTable, EveryDeviceMatchesCpu) {
  const auto& [c, size] = GetParam();
  const Dims shapes = c.shapes(size.rows, size.cols);
  auto run = [&](Device device) {
    Inputs inputs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor t = make_input(shapes[i], 17 + i, DType::kFloat32, size, device);
      t.set_requires_grad(true);
      inputs.push_back(t);
    }
    Tensor out = c.f(inputs);
    Tensor forward = out.clone();
    backward(weighted_sum(out));
    Inputs results{forward};
    for (auto& t : inputs) results.push_back(t.grad());
    return results;
  };
  const Inputs reference = run(Device::cpu());
  int compared = 0;
  for (Device device : devices()) {
    if (device.is_cpu()) continue;
    if (c.name.rfind("conv2d", 0) == 0) ACCRUE_SKIP_UNLESS_CONVOLVES(device);
    const Inputs got = run(device);
    for (size_t i = 0; i < got.size(); ++i) {
      // Sums over 10^5 float32 terms differ by their summation order: relative to the scale.
      EXPECT_LT(max_rel_error(got[i], reference[i]), size.rows * size.cols > 1000 ? 1e-4 : 1e-5)
          << c.name << " at " << size.name << " on " << device.str()
          << (i == 0 ? " forward" : " gradient");
    }
    ++compared;
  }
  if (compared == 0) GTEST_SKIP() << "no device besides the CPU: " << cuda_unavailable_reason();
}

// The ops mixed precision runs in 16 bits (layer_norm and causal_softmax take 16-bit tensors and
// compute in float32 inside, embedding sums its gradient rows in float32); the softmax family
// and the loss stay float32 by design (the trainer casts the logits up first) and refuse 16-bit
// inputs by name, as does dropout. The normalisations compute a 16-bit input in float32 (in their
// CPU kernels, or on float32 copies elsewhere).
bool takes_half(const std::string& op) {
  for (const char* prefix : {"log_softmax", "cross_entropy", "mlp", "dropout"}) {
    if (op.rfind(prefix, 0) == 0) return false;
  }
  return true;
}

// Of those, the ones that take 16 bits on the CPU alone (the CNN's convolution and pooling); the
// CUDA kernels refuse them by name.
bool takes_half_on_cpu_only(const std::string& op) {
  for (const char* prefix : {"conv2d", "max_pool2d", "avg_pool2d"}) {
    if (op.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Each op's value and gradients in a 16-bit format: every result is a float32 computation
// rounded once, so against float64 on the same (rounded) inputs and weights each output is off
// by at most a few units u = eps / 2 of the format, relative above 1 and absolute below
// (max_rel_error's measure), times how much the op's chain amplifies an input rounding: gelu
// and sigmoid first scale their input by 3 and 30, so that rounding is 3 and 30 times larger
// than the result's. The bound: 2 eps, times that gain when there is one.
TEST_P(OpTable, SixteenBitMatchesFloat64OnTheSameInputs) {
  const auto& [c, size] = GetParam();
  const Dims shapes = c.shapes(size.rows, size.cols);
  if (!takes_half(c.name)) {
    Inputs inputs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      inputs.push_back(to_dtype(make_input(shapes[i], 17 + i, DType::kFloat64, size, Device::cpu()),
                                DType::kBFloat16));
    }
    EXPECT_THROW(c.f(inputs), DTypeError) << c.name;
    return;
  }
  const double gain = c.name == "sigmoid" ? 30 : c.name == "gelu" ? 3 : 1;
  for (DType half : {DType::kBFloat16, DType::kFloat16}) {
    auto run = [&](DType dtype, Device device) {
      Inputs inputs;
      for (size_t i = 0; i < shapes.size(); ++i) {
        Tensor t =
            to_dtype(
                to_dtype(make_input(shapes[i], 17 + i, DType::kFloat64, size, Device::cpu()), half),
                dtype)
                .to(device);
        t.set_requires_grad(true);
        inputs.push_back(t);
      }
      Tensor out = c.f(inputs);
      Inputs results{out.clone()};
      const Tensor w =
          to_dtype(to_dtype(random(out.shape(), 99, DType::kFloat64), half), dtype).to(device);
      backward((out.numel() == 1 ? reshape(mul(out, w), {}) : sum(mul(out, w))));
      for (auto& t : inputs) results.push_back(t.grad());
      return results;
    };
    const Inputs reference = run(DType::kFloat64, Device::cpu());
    const double eps = half == DType::kBFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
    for (Device device : devices()) {
      if (takes_half_on_cpu_only(c.name) && !device.is_cpu()) {
        if (c.name.rfind("conv2d", 0) == 0 && !conv_unavailable_reason(device).empty()) continue;
        EXPECT_THROW(run(half, device), DTypeError) << c.name << " on " << device.str();
        continue;
      }
      const Inputs got = run(half, device);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].dtype(), half);
        EXPECT_LT(max_rel_error(got[i], reference[i]), 2 * eps * gain)
            << c.name << " at " << size.name << " in " << dtype_name(half) << " on " << device.str()
            << (i == 0 ? " forward" : " gradient");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable,
                         ::testing::Combine(::testing::ValuesIn(op_table()),
                                            ::testing::ValuesIn(kSizes)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
                         });

TEST(Ops, ForwardValuesOnKnownInputs) {
  Tensor x = Tensor::from_vector<double>({2, 3}, {1, -2, 3, 0, 0.5, -1});
  EXPECT_EQ(relu(x).to_vector<double>(), (std::vector<double>{1, 0, 3, 0, 0.5, 0}));
  EXPECT_DOUBLE_EQ(sum(x).item(), 1.5);
  EXPECT_DOUBLE_EQ(mean(x).item(), 0.25);
  Tensor w = Tensor::from_vector<double>({2, 3}, {1, 0, 0, 0, 1, 1});
  Tensor b = Tensor::from_vector<double>({2}, {10, 20});
  EXPECT_EQ(linear(x, w, b).to_vector<double>(), (std::vector<double>{11, 21, 10, 19.5}));
  EXPECT_NEAR(gelu(scalar(1.0, DType::kFloat64)).item(), 0.8413447460685429, 1e-12);
  // softmax cross-entropy of uniform logits over 4 classes is log(4) per row.
  Tensor logits = Tensor::zeros({3, 4}, DType::kFloat64);
  Tensor labels = Tensor::from_vector<int32_t>({3}, {0, 1, 3});
  EXPECT_NEAR(cross_entropy(logits, labels).item(), 3 * std::log(4.0), 1e-12);
  EXPECT_NEAR(cross_entropy(logits, labels, Reduction::kMean).item(), std::log(4.0), 1e-12);
  Tensor scores = Tensor::from_vector<float>({2, 3}, {0.1f, 0.7f, 0.2f, 0.9f, 0.05f, 0.05f});
  EXPECT_EQ(argmax(scores).to_vector<int32_t>(), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(count_equal(argmax(scores), Tensor::from_vector<int32_t>({2}, {1, 2})), 1);
}

// The causal softmax against its definition: query i sees keys 0..i, each row sums to 1, and
// the first query attends to the first key alone; on every device.
TEST(Ops, CausalSoftmaxMasksTheKeysAfterEachQuery) {
  const std::vector<double> x{1, 9, 9, 2, 3, 9, 0.5, -1, 4};  // [1, 3, 3]; 9s are masked
  for (Device device : devices()) {
    const auto y =
        causal_softmax(Tensor::from_vector<double>({1, 3, 3}, x, device), 0.5).to(Device::cpu());
    const auto v = y.to_vector<double>();
    const double e1 = std::exp(0.5 * 2), e2 = std::exp(0.5 * 3);
    const double f0 = std::exp(0.25), f1 = std::exp(-0.5), f2 = std::exp(2.0);
    const std::vector<double> want{1,
                                   0,
                                   0,
                                   e1 / (e1 + e2),
                                   e2 / (e1 + e2),
                                   0,
                                   f0 / (f0 + f1 + f2),
                                   f1 / (f0 + f1 + f2),
                                   f2 / (f0 + f1 + f2)};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(v[i], want[i], 1e-15) << i << device.str();
    // The last two queries alone, after a cached first key: the same rows, bit for bit.
    const std::vector<double> last(x.begin() + 3, x.end());
    const auto cached = causal_softmax(Tensor::from_vector<double>({1, 2, 3}, last, device), 0.5)
                            .to(Device::cpu())
                            .to_vector<double>();
    EXPECT_EQ(cached, std::vector<double>(v.begin() + 3, v.end())) << device.str();
  }
  expect_error<ShapeError>(
      [] {
        causal_softmax(Tensor::zeros({2, 4, 3}, DType::kFloat32), 1.0);
      },
      {"causal_softmax", "[B, T, L] with T <= L", "[2, 4, 3]"});
}

// An embedding's gradient: each row of the table receives the sum of the gradients of its uses
// (none: zero), on every device; on the CPU the bits do not depend on the thread count.
// float32 tanh without a library call (kernels/functors.h tanh_approx) against float64's: within
// 3e-7 relative (5 float32 ulps) over [-20, 20], near zero (the series) and across the seam at
// 0.4; exact at 0, odd, +-1 at +-inf and far out, NaN for NaN.
TEST(Ops, VectorisableTanhStaysWithinItsBound) {
  double worst = 0;
  const auto check = [&](float x) {
    const double want = std::tanh(static_cast<double>(x));
    if (want == 0) return;
    worst = std::max(worst, std::abs(fn::tanh_approx(x) - want) / std::abs(want));
  };
  for (double x = -20.0; x <= 20.0; x += 1.0 / 4096) check(static_cast<float>(x));
  for (float x = 1e-30f; x < 1.0f; x *= 1.01f) check(x), check(-x);
  for (float x = 0.399f; x < 0.401f; x = std::nextafter(x, 1.0f)) check(x);
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(fn::tanh_approx(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(fn::tanh_approx(-0.0f)));
  EXPECT_EQ(fn::tanh_approx(-0.7f), -fn::tanh_approx(0.7f));
  EXPECT_EQ(fn::tanh_approx(INFINITY), 1.0f);
  EXPECT_EQ(fn::tanh_approx(-INFINITY), -1.0f);
  EXPECT_EQ(fn::tanh_approx(50.0f), 1.0f);
  EXPECT_TRUE(std::isnan(fn::tanh_approx(NAN)));
  // NaN goes through exp without undefined behaviour (the sanitizer build checks the shift).
  EXPECT_TRUE(std::isnan(fn::exp_approx(NAN)));
  EXPECT_TRUE(std::isnan(fn::exp_approx(-NAN)));
  EXPECT_TRUE(std::isnan(fn::erf_approx(NAN)));
}

TEST(Ops, EmbeddingGradientsSumEveryUseOfARow) {
  for (Device device : devices()) {
    Tensor table = random({3, 2}, 5, DType::kFloat64).to(device);
    table.set_requires_grad(true);
    const Tensor index = Tensor::from_vector<int32_t>({2, 2}, {0, 2, 0, 0}, device);
    const Tensor y = embedding(table, index);
    EXPECT_EQ(y.shape(), (Shape{2, 2, 2}));
    backward(sum(mul(y, Tensor::from_vector<double>({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}, device))));
    EXPECT_EQ(table.grad().to(Device::cpu()).to_vector<double>(),
              (std::vector<double>{1 + 5 + 7, 2 + 6 + 8, 0, 0, 3, 4}))
        << device.str();
  }
  const Tensor dy = random({4096, 16}, 9, DType::kFloat32);
  std::vector<int32_t> rows;
  for (int i = 0; i < 4096; ++i) rows.push_back((i * 7919) % 97);
  const Tensor index = Tensor::from_vector<int32_t>({4096}, rows);
  std::vector<std::vector<float>> results;
  const int saved = cpu_threads();
  for (int threads : {1, 2, 4}) {
    set_cpu_threads(threads);
    Tensor out = Tensor::zeros({97, 16}, DType::kFloat32);
    backend_for(Device::cpu()).index_add_rows(dy, index, out);
    results.push_back(out.to_vector<float>());
  }
  set_cpu_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  expect_error<ValueError>(
      [] {
        embedding(Tensor::zeros({3, 2}, DType::kFloat32), Tensor::from_vector<int32_t>({1}, {3}));
      },
      {"[embedding] index 3", "3 rows"});
}

// Layer norm's weight and bias gradients sum over rows in blocks of a fixed size: the same bits on
// 1, 2 and 4 threads, with a short last block.
TEST(Ops, LayerNormGradientsAreTheSameOnOneTwoFourThreads) {
  const Tensor x = random({1000, 96}, 3, DType::kFloat32);
  const Tensor dy = random({1000, 96}, 4, DType::kFloat32);
  std::vector<std::vector<float>> results;
  const int saved = cpu_threads();
  for (int threads : {1, 2, 4}) {
    set_cpu_threads(threads);
    Tensor input = x.clone(), weight = random({96}, 5, DType::kFloat32),
           bias = random({96}, 6, DType::kFloat32);
    for (Tensor* t : {&input, &weight, &bias}) t->set_requires_grad(true);
    backward(sum(mul(layer_norm(input, weight, bias), dy)));
    std::vector<float> all;
    for (const Tensor* t : {&input, &weight, &bias}) {
      const std::vector<float> g = t->grad().to_vector<float>();
      all.insert(all.end(), g.begin(), g.end());
    }
    results.push_back(all);
  }
  set_cpu_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// Ignored targets (padding) are as if their rows were not there: the same loss, the same
// gradient on the kept rows and zero on the ignored ones, on every device. A label that is
// neither a class nor kIgnoreLabel is still refused.
TEST(Ops, IgnoredTargetsAreAsIfTheirRowsWereAbsent) {
  for (Device device : devices()) {
    const Tensor all = random({5, 4}, 7, DType::kFloat64).to(device);
    const Tensor kept_rows = Tensor::from_vector<int32_t>({3}, {0, 2, 3}, device);
    Tensor logits = all.clone(), kept = gather_rows(all, kept_rows);
    logits.set_requires_grad(true);
    kept.set_requires_grad(true);
    const Tensor padded =
        Tensor::from_vector<int32_t>({5}, {1, kIgnoreLabel, 3, 0, kIgnoreLabel}, device);
    const double loss = [&] {  // one tape per backward
      const Tensor l = cross_entropy(logits, padded);
      backward(l);
      return l.item();
    }();
    const Tensor reference =
        cross_entropy(kept, Tensor::from_vector<int32_t>({3}, {1, 3, 0}, device));
    backward(reference);
    EXPECT_NEAR(loss, reference.item(), 1e-12) << device.str();
    const auto g = logits.grad().to(Device::cpu()).to_vector<double>();
    const auto r = kept.grad().to(Device::cpu()).to_vector<double>();
    const int source[] = {0, -1, 1, 2, -1};  // row of the reference, or ignored
    for (int row = 0; row < 5; ++row) {
      for (int c = 0; c < 4; ++c) {
        const double want = source[row] < 0 ? 0.0 : r[static_cast<size_t>(source[row] * 4 + c)];
        EXPECT_NEAR(g[static_cast<size_t>(row * 4 + c)], want, 1e-12) << row << ", " << c;
      }
    }
  }
  expect_error<ValueError>(
      [] {
        cross_entropy(Tensor::zeros({2, 3}, DType::kFloat64),
                      Tensor::from_vector<int32_t>({2}, {0, -1}));
      },
      {"cross_entropy", "label -1"});
}

// The bytes of a tensor, on the host.
std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  const auto* p = static_cast<const unsigned char*>(host.raw());
  return {p, p + host.nbytes()};
}

// max_pool2d_relu is max_pool2d(relu(x)) to the bit, forward and gradient, in float32 and float64
// on every device. Values from {-2.5, -1, -0, 0, 1, 2} with NaNs make ties, regions of zeros and
// negatives (nothing flows back) and NaN regions; the geometries take the CPU's 2x2 path, its
// gather path (3x3 stride 1, overlapping regions) and its clipped path (padding).
TEST(Ops, MaxPoolReluIsMaxPoolOfReluToTheBit) {
  const Pool2dGeometry geometries[] = {{2, 2, 2, 2, 0, 0}, {3, 3, 1, 1, 0, 0}, {3, 3, 2, 2, 1, 1}};
  const double set[] = {-2.5, -1.0, -0.0, 0.0, 1.0, 2.0};
  const Shape shape{2, 5, 12, 14};
  std::vector<double> values(2 * 5 * 12 * 14);
  std::mt19937 rng(5);
  for (double& v : values) v = rng() % 23 == 7 ? std::nan("") : set[rng() % 6];
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (Device device : devices()) {
      for (const Pool2dGeometry& g : geometries) {
        const Tensor x = to_dtype(Tensor::from_vector<double>(shape, values), dtype).to(device);
        Tensor fused_x = x.clone(), composed_x = x.clone();
        fused_x.set_requires_grad(true);
        composed_x.set_requires_grad(true);
        const Tensor fused = max_pool2d_relu(fused_x, g);
        const Tensor dy = random(fused.shape(), 3, dtype).to(device);
        backward(fused, dy);  // a backward consumes the tape: one pass at a time
        const Tensor composed = max_pool2d(relu(composed_x), g);
        backward(composed, dy);
        const std::string where = str_cat(device.str(), " ", dtype_name(dtype), " kernel ",
                                          g.kernel_h, " stride ", g.stride_h, " pad ", g.pad_h);
        EXPECT_EQ(bytes_of(fused), bytes_of(composed)) << where;
        EXPECT_EQ(bytes_of(fused_x.grad()), bytes_of(composed_x.grad())) << where;
      }
    }
  }
}

// group_norm_relu_max_pool2d is max_pool2d(relu(group_norm(x))) to the bit: the output and the
// gradients of x, weight and bias, in float32 and float64 on every device, with and without the
// affine, with and without x's gradient, for one and several groups, each pooling path of the CPU
// (2x2 stride 2 with even and odd heights, overlapping 3x3 stride 1, padded 3x3 stride 2), 1 x 1
// planes over more than 64 samples (group norm's backward has a path of its own there), inputs
// from a few values (ties after the norm) and a NaN in one group, and a shape large enough to
// share its groups out over the threads.
TEST(Ops, GroupNormReluMaxPoolIsTheThreeOpsToTheBit) {
  struct Case {
    Shape shape;
    int64_t groups;
    Pool2dGeometry pool;
    bool few_values;
  };
  const Case cases[] = {{{2, 8, 12, 14}, 1, {2, 2, 2, 2, 0, 0}, false},
                        {{2, 8, 13, 14}, 2, {2, 2, 2, 2, 0, 0}, true},
                        {{2, 8, 12, 14}, 4, {3, 3, 1, 1, 0, 0}, true},
                        {{2, 8, 13, 14}, 2, {3, 3, 2, 2, 1, 1}, false},
                        {{70, 4, 1, 1}, 1, {1, 1, 1, 1, 0, 0}, false},
                        {{4, 32, 28, 28}, 8, {2, 2, 2, 2, 0, 0}, false}};
  const auto input = [](const Case& k, DType dtype) {
    if (!k.few_values) return random(k.shape, 1, dtype, -2, 3);
    std::vector<double> v = random(k.shape, 1, DType::kFloat64, -2, 3).to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = i == 40 ? std::nan("") : std::floor(v[i]);
    return to_dtype(Tensor::from_vector<double>(k.shape, v), dtype);
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (Device device : devices()) {
      for (const Case& k : cases) {
        for (const int mode : {0, 1, 2}) {  // affine; affine without x's gradient; no affine
          const bool affine = mode < 2, input_grad = mode != 1;
          const int64_t c = k.shape[1];
          std::vector<Tensor> leaves;  // x, weight, bias for each of the two forms
          std::vector<Tensor> outs;
          for (int form = 0; form < 2; ++form) {
            Tensor x = input(k, dtype).to(device);
            Tensor w = affine ? random({c}, 2, dtype).to(device) : Tensor();
            Tensor b = affine ? random({c}, 3, dtype).to(device) : Tensor();
            x.set_requires_grad(input_grad);
            for (Tensor* t : {&w, &b}) {
              if (t->defined()) t->set_requires_grad(true);
            }
            const Tensor y = form == 0 ? group_norm_relu_max_pool2d(x, k.groups, w, b, k.pool)
                                       : max_pool2d(relu(group_norm(x, k.groups, w, b)), k.pool);
            if (input_grad || affine) backward(y, random(y.shape(), 4, dtype).to(device));
            outs.push_back(y);
            leaves.insert(leaves.end(), {x, w, b});
          }
          const std::string where = str_cat(
              device.str(), " ", dtype_name(dtype), " ", shape_str(k.shape), " groups ", k.groups,
              " pool ", k.pool.kernel_h, " stride ", k.pool.stride_h, " mode ", mode);
          EXPECT_EQ(bytes_of(outs[0]), bytes_of(outs[1])) << where;
          for (size_t i = 0; i < 3; ++i) {
            if (!leaves[i].defined() || !leaves[i].requires_grad()) continue;
            EXPECT_EQ(bytes_of(leaves[i].grad()), bytes_of(leaves[3 + i].grad()))
                << where << ", gradient of input " << i;
          }
        }
      }
    }
  }
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
    backward(cross_entropy(linear(x, w, b), labels));
    const Tensor w_once = w.grad().clone(), b_once = b.grad().clone();
    const void* buffer = w.grad().raw();
    for (int i = 0; i < 2; ++i) backward(cross_entropy(linear(x, w, b), labels));
    EXPECT_EQ(w.grad().raw(), buffer) << "the gradient buffer must be reused in place";
    EXPECT_LT(max_rel_error(w.grad(), scale(w_once, 3.0)), 1e-6) << device.str();
    EXPECT_LT(max_rel_error(b.grad(), scale(b_once, 3.0)), 1e-6) << device.str();
  }
}

}  // namespace
}  // namespace accrue::testing
