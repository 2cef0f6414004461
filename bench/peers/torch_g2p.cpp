// The libtorch peer of accrue-g2p's default recipe, for bench/g2p-peer.sh's speed ratio: the same
// GPT (nanoGPT's pre-LayerNorm blocks, exact GELU, the head tied to the token embedding), written
// the way a PyTorch 1.13 user writes it (matmul, masked_fill and softmax for the attention), and
// the same training: the weights accrue-g2p wrote with --save-init, accrue's data pipeline
// (examples/g2p: the same sequences, vocabulary and right-padded micro-batches) and its window
// order (train/sample_order.h, each window's samples sorted by length), 32 x 4 with the loss
// summed over the phoneme targets and divided by the window's target tokens, the gradient norm
// clipped to 1, AdamW (lr 2e-3, weight decay 0.01) on accrue's warmup + cosine schedule.
//
// It prints the first window's loss and gradient norm (before clipping; accrue's step 1 must
// match them: the same model), then after `steps` optimizer steps:
// "train_seconds <s> tokens <n> tokens_per_second <r> threads <t> late_loss <l> gemm_flops <f>"
// (late_loss: the mean window loss of the last 10 steps, or of all when fewer; the GEMM FLOPs of
// those steps, the same micro-batches as accrue-g2p's: for the GEMM floor).
// With `bf16` the forward runs under CPU autocast in bfloat16, as a PyTorch user writes mixed
// precision on the CPU (torch.autocast("cpu", torch.bfloat16)): the parameters stay float32, the
// products run in bfloat16, and the logits go to float32 for the loss.
// Usage: accrue-torch-g2p <dict.txt> <init.safetensors> <threads (0: libtorch's default)> <steps>
//        [fp32|bf16]
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "g2p.h"
#include "ops/ops.h"
#include "optim/safetensors.h"
#include "optim/schedule.h"
#include "train/sample_order.h"

namespace {

using Parameters = std::map<std::string, torch::Tensor>;

// accrue's float32 tensors as libtorch leaves with gradients.
Parameters load(const std::string& path) {
  Parameters p;
  for (const auto& [name, t] : accrue::optim::read_safetensors(path)) {
    std::vector<float> values = accrue::cast(t, accrue::DType::kFloat32).to_vector<float>();
    torch::Tensor& parameter = p[name];
    parameter = torch::from_blob(values.data(), t.shape(), torch::kFloat32).clone();
    parameter.set_requires_grad(true);
  }
  return p;
}

// The GPT of nn/transformer.h: idx [B, T] int64 -> logits [B T, V].
torch::Tensor forward(const Parameters& p, const torch::Tensor& idx, int64_t layers,
                      int64_t heads) {
  namespace F = torch::nn::functional;
  const int64_t b = idx.size(0), t = idx.size(1), c = p.at("transformer.wte.weight").size(1);
  const int64_t d = c / heads;
  const auto norm = [&](const torch::Tensor& x, const std::string& name) {
    return torch::layer_norm(x, {c}, p.at(name + ".weight"), p.at(name + ".bias"), 1e-5);
  };
  const auto linear = [&](const torch::Tensor& x, const std::string& name) {
    return F::linear(x, p.at(name + ".weight"), p.at(name + ".bias"));
  };
  const auto mask = torch::ones({t, t}, torch::kBool).tril();
  torch::Tensor x = F::embedding(idx, p.at("transformer.wte.weight")) +
                    F::embedding(torch::arange(t), p.at("transformer.wpe.weight"));
  for (int64_t i = 0; i < layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i);
    const auto qkv = linear(norm(x, h + ".ln_1"), h + ".attn.c_attn").split(c, 2);
    const auto split = [&](const torch::Tensor& a) {
      return a.view({b, t, heads, d}).transpose(1, 2);
    };
    const auto q = split(qkv[0]), k = split(qkv[1]), v = split(qkv[2]);
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(d)));
    att = torch::softmax(att.masked_fill(mask.logical_not(), -INFINITY), -1);
    const auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
    x = x + linear(y, h + ".attn.c_proj");
    x = x + linear(torch::gelu(linear(norm(x, h + ".ln_2"), h + ".mlp.c_fc")), h + ".mlp.c_proj");
  }
  x = norm(x, "transformer.ln_f").view({b * t, c});
  return F::linear(x, p.at("transformer.wte.weight"));
}

torch::Tensor from_accrue(const accrue::Tensor& t) {
  std::vector<int32_t> values = t.to_vector<int32_t>();
  return torch::from_blob(values.data(), t.shape(), torch::kInt32).to(torch::kInt64);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::cerr << "usage: accrue-torch-g2p <dict.txt> <init.safetensors> <threads> <steps> "
                 "[fp32|bf16]\n";
    return 2;
  }
  const std::string precision = argc == 6 ? argv[5] : "fp32";
  if (precision != "fp32" && precision != "bf16") {
    std::cerr << "accrue-torch-g2p: the precision is fp32 or bf16, got '" << precision << "'\n";
    return 2;
  }
  const bool bf16 = precision == "bf16";
  const int threads = std::stoi(argv[3]);
  const int64_t steps = std::stoll(argv[4]);
  if (threads > 0) {
    torch::set_num_threads(threads);
    torch::set_num_interop_threads(1);
  }
  const int64_t micro = 32, k = 4, window = micro * k, layers = 4, heads = 4;
  const accrue::g2p::Data data = accrue::g2p::load_data(argv[1], 0);
  Parameters p = load(argv[2]);
  std::vector<torch::Tensor> params;
  for (auto& [name, t] : p) params.push_back(t);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(2e-3).weight_decay(0.01));
  const accrue::optim::Schedule schedule{accrue::optim::ScheduleKind::kCosine, 200, steps, 0.0};

  const int64_t n = static_cast<int64_t>(data.train.size());
  if (steps < 1 || steps > n / window) {
    std::cerr << "accrue-torch-g2p: steps must be in [1, " << n / window << "] (one epoch)\n";
    return 2;
  }
  const auto length = [&](int32_t i) { return data.train[static_cast<size_t>(i)].size(); };
  // One window: its micro-batches' backward, the clip and the update. Returns {mean loss per
  // target token, gradient norm before clipping}; `step` < 0: no update (the first-step check).
  // Non-padding input tokens, and the GEMM FLOPs of the padded micro-batches [b, T] (forward
  // per block 24 b T C^2 for the projections and the MLP, 4 b T^2 C for q k^T and the weighted
  // sum, 2 b T C V for the head; the backward twice the forward).
  struct Counts {
    int64_t tokens = 0;
    double gemm_flops = 0;
  };
  const double c = double(p.at("transformer.wte.weight").size(1));
  const double vocab = double(p.at("transformer.wte.weight").size(0));
  const auto train_window = [&](const int32_t* samples, int64_t count, int64_t step,
                                Counts& counts) {
    std::vector<int32_t> w(samples, samples + count);
    std::stable_sort(w.begin(), w.end(),
                     [&](int32_t a, int32_t b) { return length(a) < length(b); });
    int64_t targets = 0;
    for (int32_t i : w) targets += accrue::g2p::target_tokens(data.train[static_cast<size_t>(i)]);
    double loss = 0;
    for (int64_t s = 0; s < count; s += micro) {
      std::vector<const std::vector<int32_t>*> seqs;
      for (int64_t i = s; i < std::min(s + micro, count); ++i) {
        seqs.push_back(&data.train[static_cast<size_t>(w[static_cast<size_t>(i)])]);
        counts.tokens += static_cast<int64_t>(seqs.back()->size()) - 1;
      }
      const accrue::train::Samples batch =
          accrue::g2p::make_samples(seqs, 0, accrue::Device::cpu());
      const double b = double(seqs.size()), t = double(batch.input.size(1));
      counts.gemm_flops +=
          3 * (double(layers) * (24 * b * t * c * c + 4 * b * t * t * c) + 2 * b * t * c * vocab);
      torch::Tensor logits;
      {
        at::autocast::set_cpu_enabled(bf16);
        at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
        logits = forward(p, from_accrue(batch.input), layers, heads).to(torch::kFloat);
        at::autocast::set_cpu_enabled(false);
        at::autocast::clear_cache();
      }
      const auto sum =
          torch::nn::functional::cross_entropy(logits, from_accrue(batch.target),
                                               torch::nn::functional::CrossEntropyFuncOptions()
                                                   .reduction(torch::kSum)
                                                   .ignore_index(-100));
      (sum / double(targets)).backward();
      loss += sum.item<double>();
    }
    const double norm = torch::nn::utils::clip_grad_norm_(params, 1.0);
    if (step >= 0) {
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(2e-3 * schedule.factor(step));
      }
      optimizer.step();
    }
    optimizer.zero_grad();
    return std::pair<double, double>(loss / double(targets), norm);
  };

  // The first window of the file order (accrue-g2p --no-shuffle's step 1), without an update.
  const std::vector<int32_t> file_order = accrue::train::epoch_order(n, 0, 0, false);
  Counts first_counts;
  const auto [first_loss, first_norm] = train_window(file_order.data(), window, -1, first_counts);
  std::printf("first_loss %.9g first_grad_norm %.9g\n", first_loss, first_norm);

  // The first `steps` windows of epoch 1 in the shuffled order of seed 0 (accrue-g2p's default),
  // timed.
  Counts counts;
  constexpr int64_t kLateSteps = 10;
  double late_loss_sum = 0;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> order = accrue::train::epoch_order(n, 0, 0, true);
  for (int64_t step = 0; step < steps; ++step) {
    const double loss = train_window(order.data() + step * window, window, step, counts).first;
    if (step >= steps - kLateSteps) late_loss_sum += loss;
  }
  const double late_loss = late_loss_sum / double(std::min(steps, kLateSteps));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "train_seconds %.4f tokens %lld tokens_per_second %.1f threads %d late_loss %.6f "
      "gemm_flops %.6g\n",
      seconds, static_cast<long long>(counts.tokens), double(counts.tokens) / seconds,
      torch::get_num_threads(), late_loss, counts.gemm_flops);
  return 0;
}
