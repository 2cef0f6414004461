// Trains tiny models through the installed headers and library: one SGD step by hand, then the
// training engine with a task of its own (tokens 0-7, each labelled by its parity, an Embedding
// whose two columns are the logits), configured by the engine's own command-line flags.
#include <accrue.h>

#include <iostream>

int main() {
  using namespace accrue;
  nn::Linear layer(3, 2);
  optim::ParameterArena arena(layer);
  optim::SGD sgd(arena, {});
  Tensor x = full({4, 3}, 0.5);
  Tensor y = Tensor::from_vector<int32_t>({4}, {0, 1, 1, 0});
  backward(cross_entropy(layer(x), y), 0.25);
  sgd.step();

  // The shared flags, as an example program declares them (train/flags.h).
  train::Config config;
  CLI::App app{"consumer: a task of its own"};
  train::Flags flags(app, config);
  const char* argv[] = {"consumer", "--epochs", "10",  "--micro-batch", "8", "--accum-steps",
                        "2",        "--lr",     "0.1", "--threads",     "1", "--quiet"};
  const int status = train::parse_command_line(app, 12, argv, "consumer", std::cout, std::cerr,
                                               [&] { flags.check(); });
  if (status >= 0) return 1;

  std::vector<int32_t> tokens, labels;
  for (int i = 0; i < 64; ++i) tokens.push_back(i % 8), labels.push_back(i % 2);
  const Tensor inputs = Tensor::from_vector<int32_t>({64}, tokens);
  const Tensor targets = Tensor::from_vector<int32_t>({64}, labels);
  train::Task task;
  task.program = "consumer";
  task.prepare = [](const train::Setup&) { return int64_t{64}; };
  task.samples = [&](const Tensor& index) {
    return train::Samples{gather_rows(inputs, index), gather_rows(targets, index)};
  };
  task.model = [](DType dtype) { return std::make_unique<nn::Embedding>(8, 2, dtype); };
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
  const train::Summary s = train::train(config, task, std::cout);
  if (s.prints) {
    std::cout << "consumer ok: " << arena.size() << " arena elements; engine: " << s.steps
              << " steps, train accuracy " << s.evaluation.value << "\n";
  }
  return s.steps == 40 && s.evaluation.value == 1.0 ? 0 : 1;
}
