// A task that is not MNIST, for the engine's tests: 40 "sequences" whose sample i holds
// 1 + i % 3 tokens of 4 features, each token labelled with one of 3 classes, and a linear layer
// that classifies tokens. A sample's loss items are its tokens, so a window's normaliser (its
// tokens) differs from its sample count, and micro-batches of equal samples hold unequal items.
#pragma once

#include <memory>
#include <random>
#include <vector>

#include "accrue.h"

namespace accrue::testing {

struct ToyData {
  std::vector<int64_t> first;  // sample i's tokens are rows [first[i], first[i + 1])
  Tensor tokens;               // [T, 4]
  Tensor labels;               // int32 [T]
};

inline std::shared_ptr<ToyData> make_toy_data(DType dtype) {
  auto d = std::make_shared<ToyData>();
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.0, 0.5);
  std::vector<double> x;
  std::vector<int32_t> y;
  d->first.push_back(0);
  for (int64_t i = 0; i < 40; ++i) {
    for (int64_t t = 0; t < 1 + i % 3; ++t) {
      const int32_t label = static_cast<int32_t>((i + t) % 3);
      for (int f = 0; f < 4; ++f) x.push_back((f == label ? 1.5 : 0.0) + noise(rng));
      y.push_back(label);
    }
    d->first.push_back(static_cast<int64_t>(y.size()));
  }
  const int64_t n = static_cast<int64_t>(y.size());
  d->tokens = to_dtype(Tensor::from_vector<double>({n, 4}, x), dtype);
  d->labels = Tensor::from_vector<int32_t>({n}, y);
  return d;
}

// The task; `items_off_by` corrupts the item counts it declares (a test of the check).
inline train::Task toy_task(int64_t items_off_by = 0) {
  auto data = std::make_shared<std::shared_ptr<ToyData>>();
  train::Task task;
  task.program = "toy";
  task.prepare = [data](const train::Setup& setup) {
    *data = make_toy_data(setup.master);
    return int64_t{40};
  };
  task.items = [data, items_off_by](int64_t i) {
    return (*data)->first[i + 1] - (*data)->first[i] + (i == 0 ? items_off_by : 0);
  };
  task.samples = [data](const Tensor& index) {
    std::vector<int32_t> rows;
    for (int32_t i : index.to_vector<int32_t>()) {
      for (int64_t r = (*data)->first[i]; r < (*data)->first[i + 1]; ++r) {
        rows.push_back(static_cast<int32_t>(r));
      }
    }
    const Tensor at = Tensor::from_vector<int32_t>({static_cast<int64_t>(rows.size())}, rows);
    return train::Samples{gather_rows((*data)->tokens, at), gather_rows((*data)->labels, at)};
  };
  task.model = [](DType dtype) { return std::make_unique<nn::Linear>(4, 3, true, dtype); };
  task.loss = [](nn::Module& model, const train::Samples& b, DType loss_dtype) {
    return nn::LossSum{cross_entropy(cast(model(b.input), loss_dtype), b.target),
                       scalar(static_cast<double>(b.target.numel()), DType::kInt32)};
  };
  task.evaluate = [data](nn::Module& model) {
    const ToyData& d = **data;
    train::Evaluation e{"token_accuracy", "token accuracy", 0, true};
    e.value = static_cast<double>(count_equal(argmax(model(d.tokens)), d.labels)) /
              static_cast<double>(d.labels.numel());
    return e;
  };
  task.settings = {{"toy", 1}};
  return task;
}

// Per-step records and the summary of one engine run of the toy task.
struct ToyRun {
  train::Summary summary;
  std::vector<train::StepEvent> steps;
  std::vector<train::EpochEvent> epochs;
};

inline ToyRun run_toy(const train::Config& config, int64_t items_off_by = 0) {
  ToyRun run;
  train::Task task = toy_task(items_off_by);
  train::Callbacks callbacks;
  callbacks.on_step = [&](const train::StepEvent& e) { run.steps.push_back(e); };
  callbacks.on_epoch = [&](const train::EpochEvent& e) { run.epochs.push_back(e); };
  std::ostringstream out;
  run.summary = train::train(config, task, out, callbacks);
  return run;
}

inline train::Config toy_config(int64_t micro_batch, int64_t accum_steps) {
  train::Config c;
  c.precision = train::Precision::kFp64;
  c.micro_batch = micro_batch;
  c.accum_steps = accum_steps;
  c.epochs = 2;
  c.lr = 0.05;
  c.threads = 1;
  c.quiet = true;
  c.shuffle = true;
  c.seed = 3;
  return c;
}

}  // namespace accrue::testing
