// accrue-memory: peak activation memory of the MNIST MLP as a function of the precision, the
// micro-batch b and the accumulation steps k, measured by optim::Accumulator over two windows
// per point. fp32; bf16 and fp16 as accrue-mnist --precision runs them (float32 masters, a
// 16-bit working copy, 16-bit activations, float32 logits and loss). Writes a CSV (for the
// plot) and a Markdown table. Usage: accrue-memory DEVICE CSV MD [--smoke]
// (--smoke: two sizes of each axis, CTest's check that the program runs end to end)
#include <algorithm>
#include <fstream>
#include <iostream>
#include <string>

#include "accrue.h"
#include "cnn.h"
#include "kernels/cpu/blas_core.h"

int main(int argc, char** argv) {
  using namespace accrue;
  cpu::run_with_cpu_blas_kernels(argv);  // bytes do not depend on it; the run's length does
  const bool smoke = argc == 5 && std::string(argv[4]) == "--smoke";
  if (argc != 4 && !smoke) {
    std::cerr << "usage: accrue-memory DEVICE OUT.csv OUT.md [--smoke]\n";
    return 2;
  }
  const Device device = Device::parse(argv[1]);
  const auto axis = [&](std::vector<int64_t> all) {
    if (smoke) all.resize(2);
    return all;
  };
  const std::vector<int64_t> micro = axis({16, 32, 64, 128, 256});
  const std::vector<int64_t> steps = axis({1, 2, 4, 8, 16, 32, 64});
  // Without accumulation: one micro-batch as large as the effective batch.
  const std::vector<int64_t> whole = axis({512, 1024, 2048, 4096, 8192, 16384});
  std::ofstream csv(argv[2]), md(argv[3]);
  csv << "precision,micro_batch,accum_steps,effective_batch,peak_activation_bytes,peak_bytes,"
         "baseline_bytes\n";
  md << "| precision | b \\ k |";
  for (int64_t k : steps) md << " k = " << k << " |";
  md << "\n|---|---|";
  for (size_t i = 0; i < steps.size(); ++i) md << "---|";
  md << "\n";
  std::mt19937_64 rng(1);
  // Two windows of the largest effective batch.
  const int64_t samples = 2 * std::max(micro.back() * steps.back(), whole.back());
  const Tensor x = uniform({samples, 784}, -1, 1, rng, DType::kFloat32, device);
  std::vector<int32_t> labels(samples);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i % 10);
  const Tensor y = Tensor::from_vector<int32_t>({int64_t(labels.size())}, labels, device);
  struct Precision {
    const char* name;
    DType activations;
  };
  const Precision precisions[] = {
      {"fp32", DType::kFloat32}, {"bf16", DType::kBFloat16}, {"fp16", DType::kFloat16}};
  auto measure = [&](const Precision& p, int64_t b, int64_t k) {
    nn::MLP model({784, 512, 256, 128, 10});
    model.to(device);
    optim::ParameterArena arena(model);
    if (p.activations != DType::kFloat32) arena.use_working_copy(p.activations);
    optim::Adam adam(arena);
    if (p.activations == DType::kFloat16) adam.set_loss_scaling({true}, 65536);
    optim::Accumulator acc(adam, {1.0, 1e-3, {}});
    const Tensor xp = to_dtype(x, p.activations);
    for (const auto& w : optim::plan_windows(2 * b * k, optim::resolve_batch({0, b, k, 1}))) {
      acc.accumulate_window(w, [&](const optim::MicroBatch& mb) {
        const Tensor logits = cast(model(xp.narrow(mb.start, mb.count)), DType::kFloat32);
        return cross_entropy(logits, y.narrow(mb.start, mb.count));
      });
    }
    const optim::MemoryStats m = acc.memory();
    csv << p.name << "," << b << "," << k << "," << b * k << "," << m.peak_activation_bytes << ","
        << m.peak_bytes << "," << m.baseline_bytes << "\n";
    return m;
  };
  for (const Precision& p : precisions) {
    for (int64_t b : micro) {
      md << "| " << p.name << " | b = " << b << " |";
      for (int64_t k : steps)
        md << " " << measure(p, b, k).peak_activation_bytes / 1024 << " KiB |";
      md << "\n";
    }
  }
  md << "\nWithout accumulation (k = 1, micro-batch = effective batch B):\n\n| B |";
  for (const Precision& p : precisions) md << " " << p.name << " |";
  md << "\n|---|---|---|---|\n";
  for (int64_t b : whole) {
    md << "| " << b << " |";
    for (const Precision& p : precisions) {
      md << " " << measure(p, b, 1).peak_activation_bytes / 1024 << " KiB |";
    }
    md << "\n";
  }
  // The MNIST CNN (GroupNorm): the same flat line in k, at the CNN's much larger activations.
  md << "\nThe MNIST CNN (`--model cnn --norm group`), fp32:\n\n| b \\ k |";
  const std::vector<int64_t> cnn_steps = axis({1, 2, 4, 8});
  for (int64_t k : cnn_steps) md << " k = " << k << " |";
  md << "\n|---|";
  for (size_t i = 0; i < cnn_steps.size(); ++i) md << "---|";
  md << "\n";
  for (int64_t b : axis({16, 32, 64})) {
    md << "| b = " << b << " |";
    for (int64_t k : cnn_steps) {
      mnist::MnistCNN model(mnist::MnistCNN::Norm::kGroup);
      model.to(device);
      optim::ParameterArena arena(model);
      optim::Adam adam(arena);
      optim::Accumulator acc(adam, {1.0, 1e-3, {}});
      for (const auto& w : optim::plan_windows(2 * b * k, optim::resolve_batch({0, b, k, 1}))) {
        acc.accumulate_window(w, [&](const optim::MicroBatch& mb) {
          return cross_entropy(model(x.narrow(mb.start, mb.count)), y.narrow(mb.start, mb.count));
        });
      }
      const optim::MemoryStats m = acc.memory();
      csv << "cnn-fp32," << b << "," << k << "," << b * k << "," << m.peak_activation_bytes << ","
          << m.peak_bytes << "," << m.baseline_bytes << "\n";
      md << " " << m.peak_activation_bytes / 1024 << " KiB |";
    }
    md << "\n";
  }
  std::cout << "wrote " << argv[2] << " and " << argv[3] << "\n";
  return 0;
}
