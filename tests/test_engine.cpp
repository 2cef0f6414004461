// The training engine with a task that is not MNIST (toy_task.h): sequences of 1-3 tokens, so a
// window's loss items (tokens) differ from its samples and equal micro-batches hold unequal
// items. Checked: the window is normalised by its tokens however it is split, the first step's
// loss is the mean over the window's tokens computed by hand, a loss that counts other items
// than the dataset declares is refused, and a checkpointed run resumes bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <thread>

#include "kernels/backend.h"
#include "optim/registry.h"
#include "test_util.h"
#include "toy_task.h"
#include "train/flags.h"
#include "train/progress.h"
#include "train/report.h"
#include "train/sample_order.h"
#include "train/strategy.h"

namespace accrue::testing {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("accrue-engine-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Engine, TheWindowIsNormalisedByItsTokensHoweverItIsSplit) {
  const fs::path dir = scratch("split");
  std::vector<ToyRun> runs;
  std::vector<std::map<std::string, Tensor>> weights;
  for (const auto& [micro, k] :
       std::vector<std::pair<int64_t, int64_t>>{{16, 1}, {8, 2}, {4, 4}, {2, 8}}) {
    train::Config c = toy_config(micro, k);
    c.save = (dir / ("w" + std::to_string(micro) + ".safetensors")).string();
    runs.push_back(run_toy(c));
    weights.push_back(optim::read_safetensors(c.save));
  }
  // 40 samples in windows of 16: 16, 16 and a short 8, twice.
  ASSERT_EQ(runs[0].steps.size(), 6u);
  EXPECT_EQ(runs[0].steps[2].samples, 8);
  for (const ToyRun& r : runs) {
    ASSERT_EQ(r.steps.size(), runs[0].steps.size());
    for (size_t i = 0; i < r.steps.size(); ++i) {
      EXPECT_EQ(r.steps[i].items, runs[0].steps[i].items) << i;
      EXPECT_NEAR(r.steps[i].loss, runs[0].steps[i].loss, 1e-12 * runs[0].steps[i].loss) << i;
      EXPECT_NEAR(r.steps[i].grad_norm, runs[0].steps[i].grad_norm,
                  1e-12 * runs[0].steps[i].grad_norm)
          << i;
    }
  }
  for (size_t r = 1; r < weights.size(); ++r) {
    for (const auto& [name, t] : weights[0]) {
      EXPECT_LT(max_rel_error(weights[r].at(name), t), 1e-12) << name << " run " << r;
    }
  }
  // The items are tokens: more than the samples in every window here.
  EXPECT_GT(runs[0].steps[0].items, runs[0].steps[0].samples);
  fs::remove_all(dir);
}

TEST(Engine, TheFirstLossIsTheMeanOverTheWindowsTokens) {
  const train::Config c = toy_config(4, 4);
  const ToyRun run = run_toy(c);
  // The same model, by hand: the first window's 16 samples of epoch 0, every token's loss.
  nn::manual_seed(c.seed);
  nn::Linear model(4, 3, true, DType::kFloat64);
  const auto data = make_toy_data(DType::kFloat64);
  const std::vector<int32_t> order = train::epoch_order(40, c.seed, 0, true);
  double sum = 0;
  int64_t tokens = 0;
  for (int64_t s = 0; s < 16; ++s) {
    const int64_t i = order[static_cast<size_t>(s)];
    const int64_t n = data->first[i + 1] - data->first[i];
    const Tensor x = data->tokens.narrow(data->first[i], n);
    sum += cross_entropy(model(x), data->labels.narrow(data->first[i], n)).item();
    tokens += n;
  }
  EXPECT_EQ(run.steps[0].items, tokens);
  EXPECT_NEAR(run.steps[0].loss, sum / static_cast<double>(tokens), 1e-12);
}

// --early-stop ended by an epoch's own evaluation still ends with the task's final measure, once.
TEST(Engine, AnEarlyStopAtAnEpochsEndTakesTheFinalEvaluation) {
  train::Task task = toy_task();
  task.validate = [](nn::Module&) {  // never improves on the first
    train::Evaluation e{"loss", "validation loss", 1.0, false, true, true};
    return e;
  };
  int finals = 0;
  task.evaluate_final = [&finals](nn::Module&) {
    ++finals;
    return train::Evaluation{"test_accuracy", "test accuracy", 0.75};
  };
  train::Config c = toy_config(8, 2);
  c.epochs = 10;
  c.early_stop = 1;
  std::ostringstream out;
  const train::Summary s = train::train(c, task, out, {});
  EXPECT_TRUE(s.stopped_early);
  EXPECT_EQ(s.steps, 2 * 3) << "two epochs of 40 samples in windows of 16";
  EXPECT_EQ(finals, 1);
  EXPECT_EQ(s.evaluation.key, "test_accuracy");
  EXPECT_EQ(s.evaluation.value, 0.75);
}

// The training time, and the rates over it, leave out the evaluations between steps: six
// evaluations of 0.3 s each stay out of a few milliseconds of toy windows.
TEST(Engine, EvaluationsBetweenStepsAreNotTrainingTime) {
  train::Task task = toy_task();
  task.validate = [](nn::Module&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return train::Evaluation{"loss", "validation loss", 1.0, false, true, true};
  };
  train::Config c = toy_config(8, 2);
  c.eval_every = 1;
  std::ostringstream out;
  const train::Summary s = train::train(c, task, out, {});
  ASSERT_EQ(s.steps, 6);
  EXPECT_LT(s.train_seconds, 0.9) << "six evaluations of 0.3 s were counted as training";
  EXPECT_GT(s.samples_per_second, 80 / 0.9);
}

TEST(Engine, ALossCountingOtherItemsThanTheDatasetIsRefused) {
  expect_error<ValueError>([&] { run_toy(toy_config(8, 2), 1); },
                           {"[accumulator]", "counted", "plans"});
}

TEST(Engine, ACheckpointedRunResumesBitForBit) {
  const fs::path dir = scratch("resume");
  train::Config whole = toy_config(4, 2);
  whole.optimizer = "adamw";
  whole.save = (dir / "whole.safetensors").string();
  const ToyRun all = run_toy(whole);
  train::Config first = whole;
  first.save.clear();
  first.max_steps = 4;
  first.checkpoint = (dir / "ckpt").string();
  first.checkpoint_every = 2;
  std::vector<int64_t> written;
  {
    train::Task task = toy_task();
    train::Callbacks callbacks;
    callbacks.on_checkpoint = [&](const train::CheckpointEvent& e) { written.push_back(e.step); };
    std::ostringstream out;
    train::train(first, task, out, callbacks);
  }
  EXPECT_EQ(written, (std::vector<int64_t>{2, 4}));
  train::Config rest = whole;
  rest.resume = first.checkpoint;
  rest.save = (dir / "resumed.safetensors").string();
  // How the steps run on a device is not part of the run's settings: a resume may change it.
  rest.cuda_graphs = train::CudaGraphs::kOff;
  const ToyRun resumed = run_toy(rest);
  ASSERT_EQ(resumed.steps.size(), all.steps.size() - 4);
  for (size_t i = 0; i < resumed.steps.size(); ++i) {
    EXPECT_EQ(resumed.steps[i].loss, all.steps[i + 4].loss) << i;
    EXPECT_EQ(resumed.steps[i].grad_norm, all.steps[i + 4].grad_norm) << i;
  }
  EXPECT_EQ(bytes_of(rest.save), bytes_of(whole.save));
  EXPECT_EQ(resumed.summary.parameter_hash, all.summary.parameter_hash);
  // The epoch the checkpoint cut (4 of its 5 windows were run before) reports all of its windows'
  // loss, as the uninterrupted run does.
  ASSERT_EQ(resumed.epochs.size(), all.epochs.size());
  for (size_t e = 0; e < all.epochs.size(); ++e) {
    EXPECT_EQ(resumed.epochs[e].epoch, all.epochs[e].epoch);
    EXPECT_EQ(resumed.epochs[e].train_loss, all.epochs[e].train_loss) << "epoch " << e + 1;
  }
  // Rates over one span: the resumed process's samples over its own seconds; the run's total
  // since step 0 under its own name.
  int64_t before = 0;
  for (size_t i = 0; i < 4; ++i) before += all.steps[i].samples;
  EXPECT_EQ(resumed.summary.samples_seen, all.summary.samples_seen);
  EXPECT_EQ(resumed.summary.samples_trained, all.summary.samples_seen - before);
  ASSERT_GT(resumed.summary.train_seconds, 0);
  EXPECT_GT(resumed.summary.first_window_seconds, 0);
  EXPECT_LT(resumed.summary.first_window_seconds, resumed.summary.train_seconds);
  EXPECT_DOUBLE_EQ(
      resumed.summary.samples_per_second,
      static_cast<double>(resumed.summary.samples_trained) / resumed.summary.train_seconds);
  // A finished run resumed trains nothing and has no rate.
  train::Config finished = whole;
  finished.save.clear();
  finished.resume = first.checkpoint;
  finished.max_steps = 4;
  const ToyRun nothing = run_toy(finished);
  EXPECT_EQ(nothing.summary.samples_trained, 0);
  EXPECT_EQ(nothing.summary.samples_per_second, 0);
  EXPECT_EQ(nothing.summary.first_window_seconds, 0);
  // A task whose model settings differ from the checkpoint's is refused before its model is
  // built: what an edited flags record describes may not fit the machine.
  train::Task other = toy_task();
  other.settings = {{"toy", 2}};
  int models_built = 0;
  const auto build = other.model;
  other.model = [&](DType dtype) {
    ++models_built;
    return build(dtype);
  };
  std::ostringstream out;
  expect_error<ValueError>(
      [&] { train::train(rest, other, out); },
      {"--resume", "step-0000000004.json", "was written with toy = 1", "this run has 2"});
  EXPECT_EQ(models_built, 0);
  fs::remove_all(dir);
}

// An optimizer of the test's own, through the registry alone: plain gradient descent, written with
// the SGD pass at momentum 0 (its one state tensor is the pass's buffer). The engine, the flags
// and the configuration learn it from the registry: it trains, --momentum is refused for it, and
// its steps equal sgd's at momentum 0.
class PlainDescent final : public optim::Optimizer {
 public:
  PlainDescent(optim::ParameterArena& arena, double lr)
      : Optimizer(arena, lr), buffer_(state_zeros({arena.size()}, arena.dtype())) {}
  size_t state_bytes() const override { return buffer_.nbytes(); }

 protected:
  void update() override {
    backend_for(state_device())
        .sgd_step(SgdArgs{lr_, 0, 0, 0, false}, boundary_, applied_steps_, params_, grads_, buffer_,
                  working_);
  }
  void resize_state(int64_t elements) override {
    buffer_ = state_zeros({elements}, arena_.dtype());
  }
  std::vector<nn::NamedTensor> element_state() override { return {{"buffer", buffer_}}; }

 private:
  Tensor buffer_;
};

TEST(Engine, AnOptimizerRegisteredOnceTrainsThroughTheFlagsAndTheEngine) {
  static const bool registered = [] {
    optim::register_optimizer({"plain-descent", "gradient descent, no momentum", 1, false, 0.0,
                               [](optim::ParameterArena& arena, const optim::OptimizerSettings& s) {
                                 return std::make_unique<PlainDescent>(arena, s.lr);
                               }});
    return true;
  }();
  ASSERT_TRUE(registered);
  expect_error<ValueError>(
      [] {
        optim::register_optimizer(
            {"adam", "again", 2, false, 0.0, optim::optimizer_kind("adam").make});
      },
      {"'adam'", "registered already"});
  expect_error<ValueError>([] { optim::optimizer_kind("lion"); }, {"lion", "plain-descent"});
  // The flags take its name, and refuse --momentum for it, naming the one that takes it.
  const auto parse = [](std::vector<std::string> args) {
    CLI::App app;
    train::Config c;
    train::Flags flags(app, c);
    args.insert(args.begin(), "accrue-test");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    std::ostringstream out, err;
    const int status = train::parse_command_line(app, static_cast<int>(argv.size()), argv.data(),
                                                 "accrue-test", out, err, [&] { flags.check(); });
    return std::make_pair(status, err.str());
  };
  EXPECT_EQ(parse({"--optimizer", "plain-descent", "--device", "cpu"}).first, -1);
  const auto momentum = parse({"--optimizer", "plain-descent", "--momentum", "0.5"});
  EXPECT_EQ(momentum.first, 2);
  EXPECT_NE(momentum.second.find("--momentum applies to --optimizer sgd"), std::string::npos)
      << momentum.second;
  const auto unknown = parse({"--optimizer", "lion"});
  EXPECT_EQ(unknown.first, 2);
  EXPECT_NE(unknown.second.find("plain-descent"), std::string::npos) << unknown.second;
  // It trains, and takes the steps sgd takes without momentum.
  train::Config c = toy_config(4, 2);
  c.optimizer = "plain-descent";
  const ToyRun plain = run_toy(c);
  c.optimizer = "sgd";
  c.momentum = 0;
  const ToyRun sgd = run_toy(c);
  ASSERT_EQ(plain.steps.size(), sgd.steps.size());
  for (size_t i = 0; i < plain.steps.size(); ++i) {
    EXPECT_EQ(plain.steps[i].loss, sgd.steps[i].loss) << i;
  }
  EXPECT_EQ(plain.summary.parameter_hash, sgd.summary.parameter_hash);
}

// A strategy of the test's own, through the interface alone: it counts the engine's calls of its
// hooks and changes nothing, so the run equals one without it, bit for bit.
class CountingStrategy final : public train::Strategy {
 public:
  mutable std::map<std::string, int> calls;  // check_plan is const
  std::string name() const override { return "counting"; }
  distributed::Communicator& place(distributed::Communicator& ranks) override {
    ++calls["place"];
    return ranks;
  }
  void place_parameters(nn::Module&, optim::ParameterArena&) override {
    ++calls["place_parameters"];
  }
  void attach(optim::Optimizer&) override { ++calls["attach"]; }
  void check_plan(const optim::ResolvedBatch&, int64_t) const override { ++calls["check_plan"]; }
  void gather_model(nn::Module&) override { ++calls["gather_model"]; }
  void describe(nlohmann::json& run_config) const override { run_config["counting"] = true; }
  void report(train::Summary&, train::MetricsLog&) override { ++calls["report"]; }
};

TEST(Engine, AStrategyOfTheCallersOwnJoinsThroughTheInterface) {
  train::Config c = toy_config(4, 2);
  const ToyRun plain = run_toy(c);
  auto counting = std::make_shared<CountingStrategy>();
  c.strategies.push_back(counting);
  const ToyRun counted = run_toy(c);
  EXPECT_EQ(counting->calls["place"], 1);
  EXPECT_EQ(counting->calls["place_parameters"], 1);
  EXPECT_EQ(counting->calls["attach"], 1);
  EXPECT_GE(counting->calls["check_plan"], 1);
  EXPECT_EQ(counting->calls["gather_model"], c.epochs + 1);  // each evaluation, and the end
  EXPECT_EQ(counting->calls["report"], 1);
  EXPECT_EQ(counted.summary.parameter_hash, plain.summary.parameter_hash);
  ASSERT_EQ(counted.steps.size(), plain.steps.size());
  for (size_t i = 0; i < counted.steps.size(); ++i) {
    EXPECT_EQ(counted.steps[i].loss, plain.steps[i].loss) << i;
  }
}

// Plain progress (a file, a pipe, a rank of several): the first step, then a line at most every
// few seconds and at each epoch's end, never a carriage return, each with elapsed time and ETA.
// On a terminal: one line redrawn in place on its own stream, ended by clear() before any other
// message. Neither leaves its number format on the caller's stream.
TEST(Progress, PlainLinesOrOneLineInPlaceAndTheCallersFormatKept) {
  std::ostringstream out, terminal;
  {
    train::Progress plain(out, terminal, false, false, {10, 0, 20});
    for (int64_t i = 1; i <= 10; ++i) plain.update(0, i, i, 0.5, 1.0, 1e-3, 100);
  }
  EXPECT_EQ(out.str().find('\r'), std::string::npos) << out.str();
  const std::string lines = out.str();
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 2) << lines;  // the 1st, the 10th
  EXPECT_NE(out.str().find("epoch 1 step 10 (10/10) loss 0.5000"), std::string::npos);
  EXPECT_NE(out.str().find(" elapsed 0:00 eta 0:00\n"), std::string::npos) << out.str();
  EXPECT_TRUE(terminal.str().empty());
  out << 4.5678901;
  EXPECT_NE(out.str().find("\n4.56789"), std::string::npos) << out.str();  // default format

  std::ostringstream log, screen;
  {
    train::Progress in_place(log, screen, false, true, {4, 2, 10});
    in_place.update(0, 1, 3, 0.25, 1.0, 1e-3, 50);
    EXPECT_EQ(screen.str().rfind("\r\033[Kepoch 1 [", 0), 0u) << screen.str();
    EXPECT_NE(screen.str().find("1/4 loss 0.2500 50 samples/s 0:00 eta "), std::string::npos)
        << screen.str();
    in_place.clear();
    EXPECT_EQ(screen.str().substr(screen.str().size() - 4), "\r\033[K");
    in_place.clear();  // nothing drawn since: nothing written
    EXPECT_EQ(screen.str().substr(screen.str().size() - 4), "\r\033[K");
  }
  EXPECT_TRUE(log.str().empty());
  EXPECT_EQ(train::clock_time(7.4), "0:07");
  EXPECT_EQ(train::clock_time(750), "12:30");
  EXPECT_EQ(train::clock_time(3723), "1:02:03");
}

// The engine's own lines leave the caller's stream as it was.
TEST(Engine, TheCallersStreamKeepsItsFormat) {
  train::Config c = toy_config(4, 4);
  c.quiet = false;
  train::Task task = toy_task();
  std::ostringstream out;
  train::train(c, task, out, {});
  EXPECT_NE(out.str().find("done: "), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find('\r'), std::string::npos) << out.str();
  out.str("");
  out << 4.5678901;
  EXPECT_EQ(out.str(), "4.56789");
}

}  // namespace
}  // namespace accrue::testing
