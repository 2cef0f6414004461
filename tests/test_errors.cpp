// Bad input gets a clear error: the exception type, and a message that names the op and the
// actual values.
#include "test_util.h"

namespace accrue::testing {
namespace {

TEST(Errors, ShapeMismatches) {
  Tensor x = Tensor::zeros({32, 700});
  Tensor w = Tensor::zeros({10, 784});
  expect_error<ShapeError>([&] { linear(x, w, Tensor()); },
                           {"[linear]", "[32, 700]", "in_features = 784"});
  expect_error<ShapeError>(
      [&] {
        linear(Tensor::zeros({3, 784}), w, Tensor::zeros({9}));
      },
      {"[linear]", "bias", "[9]", "out_features = 10"});
  expect_error<ShapeError>(
      [&] {
        add(Tensor::zeros({2, 3}), Tensor::zeros({3, 2}));
      },
      {"[add]", "[2, 3]", "[3, 2]"});
  expect_error<ShapeError>(
      [&] {
        matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 2}));
      },
      {"[matmul]", "[2, 3]", "[4, 2]"});
  expect_error<ShapeError>(
      [&] {
        bias_add(Tensor::zeros({2, 3}), Tensor::zeros({4}));
      },
      {"[bias_add]", "[2, 3]", "[4]"});
  expect_error<ShapeError>(
      [&] {
        reshape(Tensor::zeros({2, 3}), {4, 2});
      },
      {"[reshape]", "[2, 3]", "[4, 2]"});
  expect_error<ShapeError>([&] { Tensor::zeros({2}).narrow(1, 5); }, {"[narrow]", "[2]"});
  expect_error<ShapeError>(
      [&] {
        Tensor::from_vector<float>({2, 2}, {1, 2, 3});
      },
      {"[from_vector]", "3 values", "[2, 2]"});
}

TEST(Errors, DtypeMismatches) {
  expect_error<DTypeError>([] { add(Tensor::zeros({2}), Tensor::zeros({2}, DType::kFloat64)); },
                           {"[add]", "float32[2]", "float64[2]"});
  expect_error<DTypeError>([] { relu(Tensor::zeros({2}, DType::kInt32)); }, {"[relu]", "int32"});
  expect_error<DTypeError>([] { Tensor::zeros({2}).data<double>(); }, {"float32", "float64"});
  expect_error<DTypeError>([] { Tensor::zeros({2}, DType::kInt32).set_requires_grad(true); },
                           {"int32"});
}

TEST(Errors, DeviceMismatchNamesBothDevices) {
  ACCRUE_REQUIRE_CUDA();
  Tensor a = Tensor::zeros({2, 3});
  Tensor b = Tensor::zeros({2, 3}, DType::kFloat32, Device::cuda(0));
  expect_error<DeviceError>([&] { add(a, b); }, {"[add]", "on cpu", "on cuda:0"});
  expect_error<DeviceError>(
      [&] {
        linear(a, Tensor::zeros({4, 3}, DType::kFloat32, Device::cuda(0)), Tensor());
      },
      {"[linear]", "cpu", "cuda:0"});
}

TEST(Errors, CrossEntropyLabels) {
  Tensor logits = Tensor::zeros({3, 4});
  expect_error<ValueError>(
      [&] {
        cross_entropy(logits, Tensor::from_vector<int32_t>({3}, {0, 4, 1}));
      },
      {"[cross_entropy]", "label 4", "row 1", "4 classes"});
  expect_error<ShapeError>(
      [&] {
        cross_entropy(logits, Tensor::from_vector<int32_t>({2}, {0, 1}));
      },
      {"[cross_entropy]", "[3, 4]", "[2]"});
  expect_error<DTypeError>([&] { cross_entropy(logits, Tensor::zeros({3})); },
                           {"[cross_entropy]", "int32", "float32[3]"});
}

TEST(Errors, Autograd) {
  Tensor x = random({3}, 1);
  x.set_requires_grad(true);
  expect_error<AutogradError>([&] { backward(relu(x)); }, {"[backward]", "[3]", "seed"});
  clear_tape();
  Tensor loss = sum(mul(x, x));
  backward(loss);
  expect_error<AutogradError>([&] { backward(loss); }, {"[backward]", "already consumed"});
  expect_error<AutogradError>([&] { backward(sum(random({2}, 3))); },
                              {"[backward]", "does not require grad"});
  Tensor y = sum(x);
  expect_error<AutogradError>([&] { backward(y, Tensor::zeros({2}, DType::kFloat64)); },
                              {"[backward]", "seed", "[2]"});
  clear_tape();
  Tensor stale = relu(x);
  clear_tape();
  expect_error<AutogradError>([&] { relu(stale); }, {"[relu]", "already consumed"});
}

// Modules for the error's module path: h.0 holds scale (x * w) then flatten (a reshape that
// does not fit a [3] input).
struct Scale : nn::Module {
  Scale() { w = register_parameter("w", full({3}, 2.0, DType::kFloat64)); }
  Tensor forward(const Tensor& x) override { return mul(x, w); }
  Tensor w;
};
struct Flatten : nn::Module {
  Tensor forward(const Tensor& x) override { return reshape(x, {x.size(0), 5}); }
};
struct Inner : nn::Module {
  Inner() {
    scale = register_module("scale", std::make_shared<Scale>());
    flatten = register_module("flatten", std::make_shared<Flatten>());
  }
  Tensor forward(const Tensor& x) override {
    const Tensor y = (*scale)(x);
    return flattens ? (*flatten)(y) : y;
  }
  std::shared_ptr<Scale> scale;
  std::shared_ptr<Flatten> flatten;
  bool flattens = true;
};
struct Outer : nn::Module {
  Outer() { inner = register_module("h.0", std::make_shared<Inner>()); }
  Tensor forward(const Tensor& x) override { return (*inner)(x); }
  std::shared_ptr<Inner> inner;
};

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// An op's error inside a registered module's forward names the innermost module's path, once;
// one in the backward of a node that forward recorded (here a saved input changed in place)
// names it too. The error keeps its type.
TEST(Errors, AnOpsErrorNamesTheModuleItRanIn) {
  Outer net;
  Tensor x = random({3}, 1);
  try {
    net(x);
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[reshape]", 0), 0u) << what;
    EXPECT_NE(what.find("(in module h.0.flatten's forward)"), std::string::npos) << what;
    EXPECT_EQ(count_of(what, "(in module "), 1u) << what;
  }
  EXPECT_EQ(tape_size(), 0u);
  net.inner->flattens = false;
  const Tensor y = net(x);
  fill_(x, 1.0);
  expect_error<AutogradError>([&] { backward(sum(y)); },
                              {"modified in place", "(in module h.0.scale's backward)"});
  // Outside any module: the message as the op wrote it.
  try {
    reshape(x, {4});
  } catch (const ShapeError& e) {
    EXPECT_EQ(count_of(e.what(), "(in module "), 0u) << e.what();
  }
}

// A node whose backward produces a gradient of the wrong shape is caught at the sink.
struct WrongShapeBackward : Node {
  const char* name() const override { return "wrong_shape"; }
  void backward(const Tensor&, GradSink& sink) override {
    sink.add(0, Tensor::zeros({7}, DType::kFloat64));
  }
};

TEST(Errors, GradientShapeMismatch) {
  Tensor x = random({2, 3}, 1);
  x.set_requires_grad(true);
  Tensor y = Tensor::zeros({}, DType::kFloat64);
  record(std::make_unique<WrongShapeBackward>(), {&x}, y);
  expect_error<AutogradError>([&] { backward(y); }, {"[wrong_shape backward]", "[7]", "[2, 3]"});
  EXPECT_EQ(tape_size(), 0u) << "a failed backward still leaves the tape empty";
  expect_error<ShapeError>(
      [&] {
        x.set_grad(Tensor::zeros({3, 2}, DType::kFloat64));
      },
      {"[set_grad]", "[3, 2]", "[2, 3]"});
}

TEST(Errors, ParameterLookupAndArena) {
  nn::Linear layer(3, 2);
  expect_error<ValueError>([&] { layer.parameter("weights"); }, {"'weights'", "weight", "bias"});
  std::vector<nn::NamedTensor> mixed{{"a", Tensor::zeros({2})},
                                     {"b", Tensor::zeros({2}, DType::kFloat64)}};
  expect_error<DTypeError>([&] { optim::ParameterArena arena(mixed); },
                           {"'b'", "float64", "'a'", "float32"});
  expect_error<ShapeError>([] { nn::Linear bad(0, 3); }, {"[Linear]", "in_features = 0"});
}

// Runs each row (one bad call and the error it must raise), naming the row on a failure.
void run_rows(const std::vector<std::function<void()>>& rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(str_cat("row ", i));
    rows[i]();
  }
}

// The convolution and pooling ops: each bad argument is a row, naming the op and the values it
// got.
TEST(Errors, ConvolutionAndPoolingArgumentsNameTheOpAndTheValues) {
  const Tensor image = Tensor::zeros({2, 6, 3, 4}), flat = Tensor::zeros({2, 6, 12});
  const Pool2dGeometry two{2, 2, 2, 2, 0, 0};
  run_rows({
      [&] {
        expect_error<ShapeError>(
            [&] {
              conv2d(flat, Tensor::zeros({4, 6, 3, 3}), Tensor());
            },
            {"[conv2d]", "4-D", "[2, 6, 12]"});
      },
      [&] {
        expect_error<ShapeError>(
            [&] {
              conv2d(image, Tensor::zeros({4, 5, 3, 3}), Tensor());
            },
            {"[conv2d]", "in = 6", "[4, 5, 3, 3]"});
      },
      [&] {
        expect_error<ShapeError>(
            [&] {
              conv2d(image, Tensor::zeros({4, 6, 5, 5}), Tensor());
            },
            {"[conv2d]", "height 3", "smaller than the kernel", "size 5"});
      },
      [&] {  // a stride longer than the overhang: the output size must not round up to 1
        expect_error<ShapeError>(
            [&] {
              conv2d(image, Tensor::zeros({4, 6, 5, 5}), Tensor(), {3, 3, 0, 0, 1, 1});
            },
            {"[conv2d]", "height 3", "smaller than the kernel", "size 5"});
      },
      [&] {
        expect_error<ValueError>(
            [&] {
              max_pool2d(image, {2, 2, 2, 2, 2, 2});
            },
            {"[max_pool2d]", "padding 2x2", "half the kernel 2x2"});
      },
      [&] {
        expect_error<ValueError>(
            [&] {
              max_pool2d(image, {2, 2, 0, 2, 0, 0});
            },
            {"[max_pool2d]", "height", "stride 0"});
      },
      [&] {
        expect_error<ShapeError>([&] { max_pool2d_relu(flat, two); },
                                 {"[max_pool2d_relu]", "4-D", "[2, 6, 12]"});
      },
      [&] {
        expect_error<ShapeError>(
            [&] {
              max_pool2d_relu(image, {4, 4, 1, 1, 0, 0});
            },
            {"[max_pool2d_relu]", "height 3", "smaller than the kernel", "size 4"});
      },
      [&] {
        expect_error<DTypeError>(
            [&] {
              max_pool2d_relu(Tensor::zeros({2, 6, 3, 4}, DType::kInt32), two);
            },
            {"[max_pool2d_relu]", "floating", "int32"});
      },
      [&] {  // padded, a plane of no rows would still give outputs, each pooling nothing
        expect_error<ShapeError>(
            [&] {
              max_pool2d_relu(Tensor::zeros({1, 1, 0, 4}), {2, 2, 2, 2, 1, 1});
            },
            {"[max_pool2d_relu]", "[1, 1, 0, 4]", "empty planes"});
      },
      [&] {
        expect_error<ShapeError>(
            [&] {
              avg_pool2d(Tensor::zeros({1, 1, 4, 0}), {2, 2, 2, 2, 1, 1});
            },
            {"[avg_pool2d]", "[1, 1, 4, 0]", "empty planes"});
      },
  });
}

// The normalisation ops, group norm fused with the ReLU and pooling included: a row per bad
// argument.
TEST(Errors, NormArgumentsNameTheOpAndTheValues) {
  const Tensor image = Tensor::zeros({2, 6, 3, 4}), flat = Tensor::zeros({2, 6, 12});
  const Tensor w6 = Tensor::zeros({6}), w5 = Tensor::zeros({5});
  const Pool2dGeometry two{2, 2, 2, 2, 0, 0};
  const char* fused = "[group_norm_relu_max_pool2d]";
  run_rows({
      [&] {
        expect_error<ValueError>([&] { group_norm(flat, 4, w6, w6); },
                                 {"[group_norm]", "6 channels", "4 groups"});
      },
      [&] {
        expect_error<ValueError>([&] { group_norm(flat, 3, w6, w6, 0.0); },
                                 {"[group_norm]", "eps must be > 0", "got 0"});
      },
      [&] {
        expect_error<ShapeError>([&] { group_norm(flat, 3, w5, w6); },
                                 {"[group_norm]", "weight", "[5]", "6 channels"});
      },
      [&] {
        expect_error<ShapeError>([&] { group_norm_relu_max_pool2d(flat, 3, w6, w6, two); },
                                 {fused, "4-D", "[2, 6, 12]"});
      },
      [&] {
        expect_error<ValueError>([&] { group_norm_relu_max_pool2d(image, 4, w6, w6, two); },
                                 {fused, "6 channels", "4 groups"});
      },
      [&] {
        expect_error<ShapeError>([&] { group_norm_relu_max_pool2d(image, 3, w6, w5, two); },
                                 {fused, "bias", "[5]", "6 channels"});
      },
      [&] {
        expect_error<ValueError>([&] { group_norm_relu_max_pool2d(image, 3, w6, w6, two, -1.0); },
                                 {fused, "eps must be > 0", "got -1"});
      },
      [&] {
        expect_error<ShapeError>(
            [&] {
              group_norm_relu_max_pool2d(image, 3, w6, w6, {4, 4, 4, 4, 0, 0});
            },
            {fused, "height 3", "smaller than the kernel", "size 4"});
      },
      [&] {
        expect_error<DTypeError>(
            [&] {
              group_norm_relu_max_pool2d(image, 3, Tensor::zeros({6}, DType::kFloat64), w6, two);
            },
            {fused, "different dtypes", "float64"});
      },
      [&] {
        expect_error<ShapeError>([&] { nn::GroupNorm(3, 6).forward_relu_max_pool(flat, two); },
                                 {"[GroupNorm]", "[N, 6, H, W]", "[2, 6, 12]"});
      },
      [&] {
        expect_error<ShapeError>([&] { batch_norm(image, w5, w6, w6, w6, true); },
                                 {"[batch_norm]", "weight", "[5]", "6 channels"});
      },
      [&] {
        expect_error<ValueError>([&] { batch_norm(image, w6, w6, w6, w6, true, 1.5); },
                                 {"[batch_norm]", "momentum in [0, 1]", "momentum 1.5"});
      },
      [&] {
        expect_error<ValueError>([&] { batch_norm(image, w6, w6, Tensor(), Tensor(), false); },
                                 {"[batch_norm]", "evaluation needs the running"});
      },
      [&] {  // training would update a mean without its variance
        expect_error<ValueError>(
            [&] { batch_norm(image, w6, w6, w6, Tensor(), true); },
            {"[batch_norm]", "both running statistics or neither", "only running_mean"});
      },
      [&] {  // a 16-bit input's running statistics: float32 or its own dtype, nothing else
        const Tensor half = Tensor::zeros({2, 6, 3, 4}, DType::kBFloat16);
        const Tensor h6 = Tensor::zeros({6}, DType::kBFloat16);
        Tensor fp16_mean = Tensor::zeros({6}, DType::kFloat16);
        expect_error<DTypeError>(
            [&] { batch_norm(half, h6, h6, fp16_mean, w6, true); },
            {"[batch_norm]", "running_mean", "bfloat16", "float32 or", "float16"});
      },
      [&] {  // layer norm's too, on every device
        const Tensor half = Tensor::zeros({2, 6}, DType::kBFloat16);
        expect_error<DTypeError>([&] { layer_norm(half, w6, Tensor()); },
                                 {"[layer_norm]", "different dtypes", "float32"});
      },
      [&] {  // the affine parameters of a 16-bit input share its dtype
        const Tensor half = Tensor::zeros({2, 6, 3, 4}, DType::kBFloat16);
        expect_error<DTypeError>([&] { batch_norm(half, w6, w6, w6, w6, true); },
                                 {"[batch_norm]", "different dtypes", "float32"});
      },
  });
}

}  // namespace
}  // namespace accrue::testing
