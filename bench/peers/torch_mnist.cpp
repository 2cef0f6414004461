// The libtorch peer of accrue-mnist's default recipe, for bench/run's speed ratios: the same MLP
// (784-512-256-128-10, ReLU) or CNN (--model cnn --norm group: conv 3x3 1->32, GroupNorm(8), ReLU,
// max-pool 2, conv 3x3 32->64, GroupNorm(8), ReLU, max-pool 2, fc 3136->128 ReLU, fc 128->10; the
// default initialisation of both libraries is PyTorch's), the same input normalisation, Adam (lr
// 1e-3), micro-batch 32 x 4 accumulation steps with the loss scaled by 1 / (samples in the window),
// the gradient norm clipped to 1 once per window, one epoch over a shuffled order. Written the way
// a PyTorch user writes it (zero_grad after the step, clip_grad_norm_, the optimizer's own step).
// cnn-plain is the CNN without its GroupNorms (accrue's --model cnn --norm none). With bf16 the
// forward runs under CPU autocast in bfloat16, as a PyTorch user writes mixed precision on the CPU
// (torch.autocast("cpu", torch.bfloat16)): the parameters stay float32, the logits are cast back
// to float32 for the loss. Prints one line: "train_seconds <s> threads <n> test_accuracy <a>".
// Usage: accrue-torch-mnist <mnist dir> [threads (0: libtorch's default)] [epochs]
//        [mlp|cnn|cnn-plain] [fp32|bf16]
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

uint32_t big_endian(std::ifstream& in) {
  unsigned char b[4];
  in.read(reinterpret_cast<char*>(b), 4);
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
}

// IDX images [N, 784] normalised as accrue does, and labels [N] int64.
std::pair<torch::Tensor, torch::Tensor> load(const std::string& dir, const std::string& split) {
  std::ifstream images(dir + "/" + split + "-images-idx3-ubyte", std::ios::binary);
  std::ifstream labels(dir + "/" + split + "-labels-idx1-ubyte", std::ios::binary);
  if (!images || !labels) throw std::runtime_error("cannot open the MNIST files in " + dir);
  if (big_endian(images) != 0x803 || big_endian(labels) != 0x801) {
    throw std::runtime_error("not MNIST IDX files in " + dir);
  }
  const int64_t n = big_endian(images), rows = big_endian(images), cols = big_endian(images);
  if (big_endian(labels) != uint32_t(n) || rows * cols != 784) {
    throw std::runtime_error("unexpected MNIST shapes in " + dir);
  }
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * 784);
  std::vector<uint8_t> classes(static_cast<size_t>(n));
  images.read(reinterpret_cast<char*>(pixels.data()), std::streamsize(pixels.size()));
  labels.read(reinterpret_cast<char*>(classes.data()), std::streamsize(classes.size()));
  if (!images || !labels) throw std::runtime_error("truncated MNIST files in " + dir);
  auto x = torch::from_blob(pixels.data(), {n, 784}, torch::kUInt8).to(torch::kFloat32);
  x = (x / 255.0 - 0.1307) / 0.3081;
  auto y = torch::from_blob(classes.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return {x, y};
}

struct Mlp : torch::nn::Module {
  torch::nn::Linear l0{784, 512}, l1{512, 256}, l2{256, 128}, l3{128, 10};
  Mlp() {
    register_module("l0", l0);
    register_module("l1", l1);
    register_module("l2", l2);
    register_module("l3", l3);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(l0(x));
    x = torch::relu(l1(x));
    x = torch::relu(l2(x));
    return l3(x);
  }
};

struct Cnn : torch::nn::Module {
  bool norm;
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 32, 3).padding(1)};
  torch::nn::GroupNorm norm1{8, 32};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(32, 64, 3).padding(1)};
  torch::nn::GroupNorm norm2{8, 64};
  torch::nn::Linear fc1{64 * 7 * 7, 128}, fc2{128, 10};
  explicit Cnn(bool with_norm) : norm(with_norm) {
    register_module("conv1", conv1);
    register_module("norm1", norm1);
    register_module("conv2", conv2);
    register_module("norm2", norm2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x.view({-1, 1, 28, 28});
    // GroupNorm in float32: under bf16 autocast the convolutions return bf16, which libtorch
    // 1.13's CPU group_norm refuses beside float32 parameters (a user casts, as here)
    x = conv1(x);
    x = torch::max_pool2d(torch::relu(norm ? norm1(x.to(torch::kFloat)) : x), 2);
    x = conv2(x);
    x = torch::max_pool2d(torch::relu(norm ? norm2(x.to(torch::kFloat)) : x), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }
};

// The model's logits in float32; under bf16 autocast when `bf16`.
template <typename Model>
torch::Tensor logits_of(Model& model, const torch::Tensor& x, bool bf16) {
  at::autocast::set_cpu_enabled(bf16);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  torch::Tensor logits = model.forward(x).to(torch::kFloat);
  at::autocast::set_cpu_enabled(false);
  at::autocast::clear_cache();
  return logits;
}

// One epoch of the recipe per call: micro-batches of 32, 4 per window, the loss summed and divided
// by the window's samples, the norm clipped to 1, Adam's step. Returns the seconds it took.
template <typename Model>
double train_epoch(Model& model, torch::optim::Optimizer& optimizer, const torch::Tensor& train_x,
                   const torch::Tensor& train_y, bool bf16) {
  const int64_t micro = 32, k = 4, n = train_x.size(0);
  const auto order = torch::randperm(n, torch::kInt64);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t window = 0; window < n; window += micro * k) {
    const int64_t window_samples = std::min(micro * k, n - window);
    for (int64_t s = window; s < window + window_samples; s += micro) {
      const auto index = order.slice(0, s, std::min(s + micro, window + window_samples));
      const auto logits = logits_of(model, train_x.index_select(0, index), bf16);
      const auto loss =
          torch::nn::functional::cross_entropy(
              logits, train_y.index_select(0, index),
              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
          double(window_samples);
      loss.backward();
    }
    torch::nn::utils::clip_grad_norm_(model.parameters(), 1.0);
    optimizer.step();
    optimizer.zero_grad();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <typename Model>
void run(Model& model, int epochs, const std::string& dir, bool bf16) {
  const auto [train_x, train_y] = load(dir, "train");
  const auto [test_x, test_y] = load(dir, "t10k");
  torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(1e-3));
  double seconds = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    seconds += train_epoch(model, optimizer, train_x, train_y, bf16);
  }
  torch::NoGradGuard no_grad;
  int64_t correct = 0;
  for (int64_t start = 0; start < test_x.size(0); start += 1000) {
    const auto x = test_x.slice(0, start, start + 1000), y = test_y.slice(0, start, start + 1000);
    correct += logits_of(model, x, bf16).argmax(1).eq(y).sum().template item<int64_t>();
  }
  std::printf("train_seconds %.4f threads %d test_accuracy %.4f\n", seconds,
              torch::get_num_threads(), double(correct) / double(test_x.size(0)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: accrue-torch-mnist <mnist dir> [threads] [epochs] [mlp|cnn|cnn-plain] "
                 "[fp32|bf16]\n";
    return 2;
  }
  const int threads = argc > 2 ? std::stoi(argv[2]) : 0;
  const int epochs = argc > 3 ? std::stoi(argv[3]) : 1;
  if (threads > 0) {
    torch::set_num_threads(threads);
    torch::set_num_interop_threads(1);
  }
  const std::string model = argc > 4 ? argv[4] : "mlp";
  if (model != "mlp" && model != "cnn" && model != "cnn-plain") {
    std::cerr << "accrue-torch-mnist: model '" << model << "': expected mlp, cnn or cnn-plain\n";
    return 2;
  }
  const std::string precision = argc > 5 ? argv[5] : "fp32";
  if (precision != "fp32" && precision != "bf16") {
    std::cerr << "accrue-torch-mnist: the precision is fp32 or bf16, got '" << precision << "'\n";
    return 2;
  }
  const bool bf16 = precision == "bf16";
  torch::manual_seed(0);
  if (model == "mlp") {
    Mlp mlp;
    run(mlp, epochs, argv[1], bf16);
  } else {
    Cnn cnn(model == "cnn");
    run(cnn, epochs, argv[1], bf16);
  }
  return 0;
}
