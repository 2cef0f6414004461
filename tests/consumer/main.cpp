// Trains a tiny model through the installed headers and library: one SGD step by hand, then a
// short run of the training engine with a task of its own (two Gaussian blobs, a linear layer).
#include <accrue.h>

#include <iostream>
#include <random>

int main() {
  using namespace accrue;
  nn::Linear layer(3, 2);
  optim::ParameterArena arena(layer);
  optim::SGD sgd(arena, {});
  Tensor x = full({4, 3}, 0.5);
  Tensor y = Tensor::from_vector<int32_t>({4}, {0, 1, 1, 0});
  backward(cross_entropy(layer(x), y), 0.25);
  sgd.step();

  std::mt19937_64 rng(1);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> points;
  std::vector<int32_t> labels;
  for (int i = 0; i < 64; ++i) {
    labels.push_back(i % 2);
    for (int d = 0; d < 3; ++d) points.push_back((i % 2 ? 1.0f : -1.0f) + noise(rng));
  }
  const Tensor inputs = Tensor::from_vector<float>({64, 3}, points);
  const Tensor targets = Tensor::from_vector<int32_t>({64}, labels);
  train::Task task;
  task.program = "consumer";
  task.prepare = [](const train::Setup&) { return int64_t{64}; };
  task.samples = [&](const Tensor& index) {
    return train::Samples{gather_rows(inputs, index), gather_rows(targets, index)};
  };
  task.model = [](DType dtype) { return std::make_unique<nn::Linear>(3, 2, true, dtype); };
  task.loss = [](nn::Module& model, const train::Samples& b, DType) {
    return nn::LossSum{cross_entropy(model(b.input), b.target),
                       scalar(double(b.target.numel()), DType::kInt32)};
  };
  task.evaluate = [&](nn::Module& model) {
    train::Evaluation e;
    e.key = "train_accuracy";
    e.label = "train accuracy";
    e.value = double(count_equal(argmax(model(inputs)), targets)) / 64.0;
    return e;
  };
  train::Config config;
  config.epochs = 3;
  config.micro_batch = 8;
  config.accum_steps = 2;
  config.lr = 0.05;
  config.threads = 1;
  config.quiet = true;
  const train::Summary s = train::train(config, task, std::cout);
  std::cout << "consumer ok: " << arena.size() << " arena elements; engine: " << s.steps
            << " steps, train accuracy " << s.evaluation.value << "\n";
  return s.steps == 12 && s.evaluation.value > 0.9 ? 0 : 1;
}
