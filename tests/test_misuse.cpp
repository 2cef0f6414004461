// Misuse of the library API: each case is an error that names the op and the values, never a
// crash, an out-of-bounds write or a silently wrong gradient.
#include <thread>

#include "test_util.h"

namespace accrue::testing {
namespace {

TEST(Misuse, UndefinedTensorsThrowInsteadOfCrashing) {
  const Tensor t;
  expect_error<ValueError>([&] { (void)t.numel(); }, {"[numel]", "undefined"});
  expect_error<ValueError>([&] { (void)t.shape(); }, {"[shape]", "undefined"});
  expect_error<ValueError>([&] { (void)t.narrow(0, 1); }, {"undefined"});
  expect_error<ValueError>([&] { (void)t.raw(); }, {"[raw]", "undefined"});
  expect_error<ValueError>([&] { (void)t.requires_grad(); }, {"undefined"});
  expect_error<ValueError>([&] { relu(t); }, {"undefined"});
}

TEST(Misuse, SizesThatOverflowAreRejected) {
  const Tensor x = Tensor::zeros({4, 3});
  expect_error<ShapeError>([&] { (void)x.narrow(1, INT64_MAX); },
                           {"[narrow]", "9223372036854775807", "row 1", "[4, 3]"});
  expect_error<ShapeError>([&] { (void)x.narrow(INT64_MAX, 1); }, {"[narrow]"});
  expect_error<ShapeError>([&] { (void)x.narrow(5, 0); }, {"[narrow]"});
  EXPECT_EQ(x.narrow(4, 0).numel(), 0);
  expect_error<ShapeError>(
      [] {
        Tensor::zeros({int64_t(1) << 32, int64_t(1) << 32});
      },
      {"[shape]", "[4294967296, 4294967296]", "int64"});
  expect_error<ShapeError>(
      [] {
        Tensor::empty({int64_t(1) << 61, 2});
      },
      {"[empty]", "float32[2305843009213693952, 2]", "size_t"});
  expect_error<ShapeError>([] { Tensor::zeros({2, -1}); }, {"negative"});
}

// Backward runs on the thread that recorded the forward; another thread's tape does not hold
// the node (before the fix it indexed that tape out of bounds).
TEST(Misuse, BackwardOnAnotherThreadIsAnError) {
  Tensor w = random({3}, 1);
  w.set_requires_grad(true);
  Tensor loss = sum(mul(w, w));
  bool threw = false;
  std::string message;
  std::thread other([&] {
    // Record something there too, so the other tape is not simply empty.
    Tensor v = random({3}, 2);
    v.set_requires_grad(true);
    Tensor unrelated = sum(relu(v));
    try {
      backward(loss);
    } catch (const AutogradError& e) {
      threw = true;
      message = e.what();
    }
    clear_tape();
  });
  other.join();
  EXPECT_TRUE(threw);
  EXPECT_NE(message.find("another thread"), std::string::npos) << message;
  EXPECT_FALSE(w.grad().defined());
  backward(loss);  // on its own thread it still works
  EXPECT_TRUE(w.grad().defined());
}

// A module whose forward throws halfway leaves the tape as it found it.
TEST(Misuse, AForwardThatThrowsLeavesNothingOnTheTape) {
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(4, 3));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::Linear>(5, 2));  // does not fit the previous layer
  expect_error<ShapeError>([&] { model(Tensor::zeros({2, 4})); }, {"[linear]", "[2, 3]"});
  EXPECT_EQ(tape_size(), 0u);
}

// The version counter: a tensor saved for backward and then modified in place makes backward
// throw, naming the node, instead of computing a gradient from the new values.
TEST(Misuse, ModifyingASavedTensorBeforeBackwardIsAnError) {
  Tensor x = random({2, 3}, 1);
  Tensor w = random({4, 3}, 2);
  w.set_requires_grad(true);
  Tensor loss = sum(linear(x, w, Tensor()));
  fill_(x, 0.5);
  expect_error<AutogradError>([&] { backward(loss); },
                              {"[linear backward]", "float64[2, 3]", "modified in place"});
  EXPECT_EQ(tape_size(), 0u);
  // Saved outputs too: tanh saves y.
  Tensor y = accrue::tanh(w);
  Tensor total = sum(y);
  y.copy_(Tensor::zeros({4, 3}, DType::kFloat64));
  expect_error<AutogradError>([&] { backward(total); }, {"[tanh backward]"});
  // Dropout keeps the rows' sample indices, which key its mask: a staging buffer reused for the
  // next micro-batch's indices before this backward would give another mask.
  Tensor samples = Tensor::from_vector<int32_t>({4}, {0, 1, 2, 3});
  Tensor dropped = sum(dropout(w, {0.5, 7, 1}, samples));
  samples.copy_(Tensor::from_vector<int32_t>({4}, {4, 5, 6, 7}));
  expect_error<AutogradError>([&] { backward(dropped); }, {"[dropout backward]", "int32[4]"});
}

// The classic accumulation bug: an optimizer step between a forward and its backward.
TEST(Misuse, AnUpdateBetweenForwardAndBackwardIsAnError) {
  nn::manual_seed(1);
  nn::MLP model({3, 4, 2});
  optim::ParameterArena arena(model);
  optim::SGD sgd(arena, {});
  Tensor loss = cross_entropy(model(random({2, 3}, 3, DType::kFloat32)),
                              Tensor::from_vector<int32_t>({2}, {0, 1}));
  sgd.step();
  expect_error<AutogradError>([&] { backward(loss); }, {"backward]", "modified in place"});
}

// NaN is not an activation's to hide: a ReLU passes it on (PyTorch does too), so NaN weights
// behind a ReLU reach the loss and the boundary step skips the update instead of training on.
TEST(Misuse, ReluPropagatesNaNOnEveryDevice) {
  for (Device device : devices()) {
    const Tensor x = Tensor::from_vector<float>({3}, {NAN, -1.0f, 2.0f}, device);
    const auto y = relu(x).to_vector<float>();
    EXPECT_TRUE(std::isnan(y[0])) << device.str();
    EXPECT_EQ(y[1], 0.0f);
    EXPECT_EQ(y[2], 2.0f);
  }
}

TEST(Misuse, AParameterJoinsOneArenaAtATime) {
  nn::MLP model({3, 2});
  {
    optim::ParameterArena first(model);
    expect_error<ValueError>([&] { optim::ParameterArena second(model); },
                             {"'layers.0.weight'", "already belongs"});
  }
  optim::ParameterArena again(model);  // the first one is gone
  EXPECT_EQ(again.entries().size(), 2u);
}

// A micro-step whose forward throws abandons the window: no partial gradient stays in the arena
// to leak into the next update, and the tape is empty.
// A small MLP, its optimizer and accumulator, and a batch of four.
struct SmallRun {
  explicit SmallRun(const std::vector<int64_t>& sizes) : model((nn::manual_seed(1), sizes)) {}
  nn::MLP model;
  optim::ParameterArena arena{model};
  optim::SGD sgd{arena, {}};
  optim::Accumulator acc{sgd, {}};
  const Tensor x = random({4, 3}, 3, DType::kFloat32);
  const Tensor y = Tensor::from_vector<int32_t>({4}, {0, 1, 1, 0});
};

TEST(Misuse, AFailedMicroStepAbandonsTheWindow) {
  SmallRun s({3, 4, 2});
  auto& [model, arena, sgd, acc, x, y] = s;
  acc.begin_window(4);
  acc.micro_step(2, [&] { return cross_entropy(model(x.narrow(0, 2)), y.narrow(0, 2)); });
  expect_error<ValueError>(
      [&] {
        acc.micro_step(2, [&] {
          Tensor logits = model(x.narrow(2, 2));
          return cross_entropy(logits, Tensor::from_vector<int32_t>({2}, {0, 7}));
        });
      },
      {"[cross_entropy]", "label 7"});
  EXPECT_EQ(tape_size(), 0u);
  for (float g : arena.grads().to_vector<float>()) ASSERT_EQ(g, 0.0f);
  acc.begin_window(4);  // a new window opens cleanly
}

// A counted micro-step refused for its size changes nothing: the window still takes bare losses
// (or counted ones) as if the call had not been made, and counts what it was given.
TEST(Misuse, ARefusedCountedMicroStepLeavesTheWindowAsItWas) {
  SmallRun s({3, 2});
  auto& [model, arena, sgd, acc, x, y] = s;
  acc.begin_window(4);
  int forwards = 0;
  expect_error<ValueError>(
      [&] {
        acc.micro_step(8, [&] {
          ++forwards;
          return nn::LossSum{cross_entropy(model(x), y), scalar(4.0, DType::kFloat32)};
        });
      },
      {"micro-batch of 8 items overflows the window", "0 of 4"});
  EXPECT_EQ(forwards, 0);
  acc.micro_step(4, [&] { return cross_entropy(model(x), y); });  // a bare loss is still welcome
  EXPECT_EQ(acc.step().items, 4);
  EXPECT_EQ(sgd.applied_steps(), 1);
}

// A loss may give its count as a tensor, as a number the host knows (no kernel counts it), or
// both: the window's sum is the same, and checked the same way at the boundary. Each row: the two
// micro-steps' counts, and the error (empty: the window steps).
TEST(Misuse, HostCountsAreSummedAndCheckedLikeCountTensors) {
  struct Row {
    const char* name;
    std::function<nn::LossSum(const Tensor& loss, int micro)> count;
    std::vector<std::string> error;  // at the micro-step or at the boundary; empty: none
  };
  const auto tensor = [](double n) { return scalar(n, DType::kFloat32); };
  const std::vector<Row> rows = {
      {"tensors",
       [&](const Tensor& l, int) {
         return nn::LossSum{l, tensor(2)};
       },
       {}},
      {"host",
       [&](const Tensor& l, int) {
         return nn::LossSum{l, Tensor(), 2};
       },
       {}},
      {"both",
       [&](const Tensor& l, int) {
         return nn::LossSum{l, tensor(1), 1};
       },
       {}},
      {"host then tensor",
       [&](const Tensor& l, int m) {
         return m == 0 ? nn::LossSum{l, Tensor(), 2} : nn::LossSum{l, tensor(2)};
       },
       {}},
      {"host miscounted",
       [&](const Tensor& l, int m) {
         return nn::LossSum{l, Tensor(), m == 0 ? 2.0 : 1.0};
       },
       {"[accumulator]", "counted 3 items", "plans 4"}},
      {"neither",
       [&](const Tensor& l, int) {
         return nn::LossSum{l, Tensor()};
       },
       {"[accumulator]", "one element or a host count > 0", "undefined tensor"}},
      {"negative host count",
       [&](const Tensor& l, int) {
         return nn::LossSum{l, Tensor(), -2};
       },
       {"[accumulator]", "host count -2"}},
      {"NaN host count",
       [&](const Tensor& l, int) {
         return nn::LossSum{l, Tensor(), std::nan("")};
       },
       {"[accumulator]", "host count nan"}},
      {"two-element tensor",
       [&](const Tensor& l, int) {
         return nn::LossSum{l, Tensor::zeros({2}, DType::kFloat32)};
       },
       {"[accumulator]", "float32[2]"}},
  };
  std::vector<float> stepped;  // the weights after the first row's window
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    SmallRun s({3, 2});
    auto& [model, arena, sgd, acc, x, y] = s;
    const auto window = [&] {
      acc.begin_window(4);
      for (int m = 0; m < 2; ++m) {
        acc.micro_step(
            2, [&] { return row.count(cross_entropy(model(x.narrow(0, 2)), y.narrow(0, 2)), m); });
      }
      return acc.step();
    };
    if (!row.error.empty()) {
      expect_error<ValueError>(window, row.error);
      EXPECT_EQ(sgd.applied_steps(), 0);
      continue;
    }
    EXPECT_EQ(window().items, 4);
    if (stepped.empty()) stepped = arena.masters().to_vector<float>();
    EXPECT_EQ(arena.masters().to_vector<float>(), stepped);
    EXPECT_EQ(window().items, 4) << "the next window starts from no count";
  }
}

// A micro-step replayed from a CUDA graph counts what the micro-step it was captured from
// counted: a host count is added again on the host, and a count tensor is the graph's to add
// on the device (a launch that adds none is caught there, at the boundary). Graph or not, the
// accumulator's bookkeeping is the same, so the CPU checks it with launches that stand in.
TEST(Misuse, AReplayedMicroStepCountsWhatItsCaptureCounted) {
  for (const bool on_host : {true, false}) {
    SCOPED_TRACE(on_host ? "host count" : "count tensor");
    SmallRun s({3, 2});
    auto& [model, arena, sgd, acc, x, y] = s;
    acc.begin_window(4);
    acc.micro_step(2, [&] {
      const Tensor loss = cross_entropy(model(x.narrow(0, 2)), y.narrow(0, 2));
      return on_host ? nn::LossSum{loss, Tensor(), 2} : nn::LossSum{loss, scalar(2.0)};
    });
    const optim::Accumulator::LossCounts counted = acc.last_counts();
    EXPECT_EQ(counted.host, on_host ? 2.0 : 0.0);
    EXPECT_EQ(counted.device, !on_host);
    int launches = 0;
    acc.replayed_micro_step(
        2, [&] { ++launches; }, counted);
    EXPECT_EQ(launches, 1);
    if (on_host) {
      EXPECT_EQ(acc.step().items, 4);
    } else {
      expect_error<ValueError>([&] { acc.step(); }, {"counted 2 items", "plans 4"});
    }
  }
}

// Device-resident indices and labels cannot be checked by the host without a copy: a kernel
// records the first bad one, the next host read reports it, and a bad label's window is skipped.
TEST(Misuse, BadDeviceIndicesAndLabelsAreReportedAtTheNextHostRead) {
  ACCRUE_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  const Tensor src = random({4, 3}, 1, DType::kFloat32).to(gpu);
  const Tensor rows = gather_rows(src, Tensor::from_vector<int32_t>({2}, {1, 9}, gpu));
  expect_error<ValueError>([&] { rows.to(Device::cpu()); },
                           {"[gather_rows] index 9", "position 1", "[0, 4)", "cuda:0"});
  EXPECT_EQ(rows.to(Device::cpu()).numel(), 6) << "the fault is reported once";

  nn::manual_seed(1);
  nn::MLP model({3, 2});
  model.to(gpu);
  optim::ParameterArena arena(model);
  optim::SGD sgd(arena, {});
  optim::Accumulator acc(sgd, {});
  const auto before = arena.masters().to_vector<float>();
  const Tensor x = random({2, 3}, 3, DType::kFloat32).to(gpu);
  acc.begin_window(2);
  acc.micro_step(2, [&] {
    return cross_entropy(model(x), Tensor::from_vector<int32_t>({2}, {0, 5}, gpu));
  });
  expect_error<ValueError>([&] { acc.step(); }, {"[cross_entropy] label 5", "position 1"});
  EXPECT_EQ(arena.masters().to_vector<float>(), before) << "the window must be skipped";
  EXPECT_EQ(sgd.applied_steps(), 0);
}

TEST(Misuse, OptimizerHyperParametersMustBeFinite) {
  nn::MLP model({3, 2});
  optim::ParameterArena arena(model);
  optim::SgdOptions nan_lr;
  nan_lr.lr = NAN;
  expect_error<ValueError>([&] { optim::SGD(arena, nan_lr); }, {"learning rate", "nan"});
  optim::SgdOptions momentum;
  momentum.momentum = NAN;
  expect_error<ValueError>([&] { optim::SGD(arena, momentum); }, {"[SGD] momentum", "nan"});
  optim::AdamOptions decay;
  decay.weight_decay = INFINITY;
  expect_error<ValueError>([&] { optim::Adam(arena, decay); }, {"[Adam] weight_decay", "inf"});
  optim::SGD sgd(arena, {});
  expect_error<ValueError>([&] { sgd.set_lr(INFINITY); }, {"learning rate", "inf"});
  optim::AccumulatorOptions nan_clip;
  nan_clip.max_norm = NAN;
  expect_error<ValueError>([&] { optim::Accumulator acc(sgd, nan_clip); }, {"max_norm"});
  expect_error<ValueError>(
      [] {
        optim::plan_windows(10, {10, 0, 4, 1});
      },
      {"[plan_windows]", "micro_batch = 0"});
  expect_error<ValueError>(
      [] {
        optim::resolve_batch({0, int64_t(1) << 62, 4, 1});
      },
      {"[batch]", "overflows"});
}

// A world of three ranks that never communicates: enough to shard an optimizer in one process.
struct ThreeRanks final : distributed::Communicator {
  int rank() const override { return 1; }
  int world_size() const override { return 3; }
  int local_rank() const override { return 1; }
  const char* backend() const override { return "fake"; }
  void all_reduce_sum(Tensor&) override {}
  void broadcast(Tensor&, int) override {}
  void all_gather(const Tensor&, Tensor&) override {}
  void reduce_scatter(const Tensor&, Tensor&) override {}
  void barrier() override {}
  std::unique_ptr<distributed::Transfer> isend(const Tensor&, int, int) override {
    throw std::logic_error("ThreeRanks never communicates");
  }
  std::unique_ptr<distributed::Transfer> irecv(Tensor&, int, int) override {
    throw std::logic_error("ThreeRanks never communicates");
  }
  std::unique_ptr<distributed::Communicator> split(int, int) override {
    throw std::logic_error("ThreeRanks never communicates");
  }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

TEST(Misuse, ShardingNeedsEqualShardsAndComesBeforeTheFirstStep) {
  ThreeRanks world;
  nn::Linear layer(3, 5);  // 15 + 5 elements, each padded to 16: 32, not a multiple of 3
  {
    optim::ParameterArena arena(layer);
    optim::Adam adam(arena);
    expect_error<ValueError>([&] { distributed::ZeroOptimizerState zero(adam, world); },
                             {"32 elements", "3 equal shards", "ParameterArena(module, 3)"});
  }
  optim::ParameterArena arena(layer, 3);  // padded to 48: shards of 16
  EXPECT_EQ(arena.size(), 48);
  optim::Adam adam(arena);
  const size_t full = adam.state_bytes();
  distributed::ZeroOptimizerState zero(adam, world);
  EXPECT_EQ(adam.state_bytes(), full / 3);
  optim::SGD sgd(arena, {});
  sgd.step();
  expect_error<ValueError>([&] { distributed::ZeroOptimizerState late(sgd, world); },
                           {"after the first step"});
  expect_error<ValueError>(
      [&] { optim::ParameterArena bad(nn::Linear(2, 2).named_parameters(), 0); }, {"shards = 0"});
}

}  // namespace
}  // namespace accrue::testing
