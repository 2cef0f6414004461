// Gradient accumulation: the accumulated gradient equals the full-batch gradient of the mean
// loss for any split (equal, unequal, partial last window, reordered), the reported loss and
// norm do not depend on the split, schedules tick once per optimizer step, and memory follows
// the micro-batch, not the window.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/host_waits.h"
#include "test_util.h"

namespace accrue::testing {
namespace {

using optim::Accumulator;
using optim::AccumulatorOptions;

struct Rig {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::ParameterArena> arena;
  std::unique_ptr<optim::Adam> adam;
  std::unique_ptr<Accumulator> acc;
  Tensor x, y;  // the dataset, on the device
};

// A 3-layer MLP on 64 random samples; identical for identical arguments.
Rig make_setup(DType dtype, Device device = Device::cpu(), int64_t samples = 64,
               AccumulatorOptions options = {}) {
  Rig s;
  nn::manual_seed(11);
  s.model = std::make_shared<nn::Sequential>();
  s.model->add(std::make_shared<nn::Linear>(12, 24, true, dtype));
  s.model->add(std::make_shared<nn::Tanh>());
  s.model->add(std::make_shared<nn::Linear>(24, 16, true, dtype));
  s.model->add(std::make_shared<nn::ReLU>());
  s.model->add(std::make_shared<nn::Linear>(16, 5, true, dtype));
  s.model->to(device);
  s.arena = std::make_unique<optim::ParameterArena>(*s.model);
  s.adam = std::make_unique<optim::Adam>(*s.arena);
  s.acc = std::make_unique<Accumulator>(*s.adam, options);
  s.x = random({samples, 12}, 3, dtype, -2, 2).to(device);
  std::vector<int32_t> labels(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) labels[i] = static_cast<int32_t>((i * 3 + i / 7) % 5);
  s.y = Tensor::from_vector<int32_t>({samples}, labels, device);
  return s;
}

// Sum-reduced loss of the samples at `rows` (gathered into a contiguous batch).
Tensor loss_of(Rig& s, const std::vector<int64_t>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  Tensor xb = Tensor::empty({n, 12}, s.x.dtype(), s.x.device());
  Tensor yb = Tensor::empty({n}, DType::kInt32, s.x.device());
  for (int64_t i = 0; i < n; ++i) {
    xb.narrow(i, 1).copy_(s.x.narrow(rows[i], 1));
    yb.narrow(i, 1).copy_(s.y.narrow(rows[i], 1));
  }
  return cross_entropy((*s.model)(xb), yb);
}

std::vector<int64_t> range(int64_t begin, int64_t end) {
  std::vector<int64_t> r(static_cast<size_t>(end - begin));
  std::iota(r.begin(), r.end(), begin);
  return r;
}

// Accumulates the window [0, total) split into micro-batches of the given sizes; returns a copy
// of the gradient arena (before any step).
Tensor accumulated_gradient(Rig& s, const std::vector<int64_t>& sizes,
                            const std::vector<int64_t>& order) {
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  s.acc->begin_window(total);
  int64_t start = 0;
  for (int64_t size : sizes) {
    std::vector<int64_t> rows(order.begin() + start, order.begin() + start + size);
    s.acc->micro_step(size, [&] { return loss_of(s, rows); });
    start += size;
  }
  return s.arena->grads().clone();
}

// max |a - b| / max |b|
double rel_error(const Tensor& a, const Tensor& b) {
  const auto va = as_doubles(a), vb = as_doubles(b);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return diff / scale;
}

class Split : public ::testing::TestWithParam<int64_t> {};

TEST_P(Split, EqualMicroBatchesMatchTheFullBatch) {
  const int64_t k = GetParam();
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    Rig full = make_setup(dtype), split = make_setup(dtype);
    const Tensor reference = accumulated_gradient(full, {64}, range(0, 64));
    const Tensor got = accumulated_gradient(
        split, std::vector<int64_t>(static_cast<size_t>(k), 64 / k), range(0, 64));
    const double err = rel_error(got, reference);
    if (dtype == DType::kFloat32) {
      EXPECT_LE(err, 1e-5) << "k = " << k;
    } else {
      EXPECT_LE(err, 1e-14) << "k = " << k << " in float64 must agree to rounding";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(K, Split, ::testing::Values(1, 2, 4, 8));

TEST(Accumulation, UnequalMicroBatchesMatchTheFullBatch) {
  Rig full = make_setup(DType::kFloat64), split = make_setup(DType::kFloat64);
  const Tensor reference = accumulated_gradient(full, {64}, range(0, 64));
  EXPECT_LE(rel_error(accumulated_gradient(split, {5, 40, 1, 18}, range(0, 64)), reference), 1e-14);
}

TEST(Accumulation, SampleOrderAcrossMicroBatchesDoesNotMatter) {
  Rig full = make_setup(DType::kFloat64), split = make_setup(DType::kFloat64);
  const Tensor reference = accumulated_gradient(full, {64}, range(0, 64));
  std::vector<int64_t> order = range(0, 64);
  std::mt19937_64 rng(5);
  std::shuffle(order.begin(), order.end(), rng);
  EXPECT_LE(rel_error(accumulated_gradient(split, {16, 16, 16, 16}, order), reference), 1e-14);
}

// The tutorials' recipe (mean loss of each micro-batch divided by k) is wrong when micro-batch
// sizes differ; this pins down that the difference is real, so the test above means something.
TEST(Accumulation, MeanOverKIsWrongForUnequalSizes) {
  Rig full = make_setup(DType::kFloat64), naive = make_setup(DType::kFloat64);
  const Tensor reference = accumulated_gradient(full, {64}, range(0, 64));
  const std::vector<int64_t> sizes{8, 56};
  int64_t start = 0;
  for (int64_t size : sizes) {
    backward(scale(loss_of(naive, range(start, start + size)), 1.0 / double(size)), 0.5);
    start += size;
  }
  EXPECT_GT(rel_error(naive.arena->grads(), reference), 1e-3);
}

TEST(Accumulation, PartialLastWindowIsNormalisedByItsOwnSize) {
  const optim::ResolvedBatch batch = optim::resolve_batch({32, 8, 0, 1});
  const auto windows = optim::plan_windows(70, batch);
  ASSERT_EQ(windows.size(), 3u);
  EXPECT_EQ(windows[2].samples, 6);
  ASSERT_EQ(windows[2].micro.size(), 1u);
  EXPECT_EQ(windows[2].micro[0].start, 64);
  const auto dropped = optim::plan_windows(70, batch, optim::LastWindow::kDrop);
  EXPECT_EQ(dropped.size(), 2u);
  const auto uneven = optim::plan_windows(45, batch);
  ASSERT_EQ(uneven[1].micro.size(), 2u);
  EXPECT_EQ(uneven[1].micro[1].count, 5);

  Rig full = make_setup(DType::kFloat64, Device::cpu(), 70);
  Rig split = make_setup(DType::kFloat64, Device::cpu(), 70);
  const Tensor reference = accumulated_gradient(full, {6}, range(64, 70));
  EXPECT_LE(rel_error(accumulated_gradient(split, {4, 2}, range(64, 70)), reference), 1e-14);
}

// The boundary reads the device once, after the reducer's collectives have settled (the NCCL
// communicator polls them under the watchdog there: a plain read would wait forever for a
// stopped peer); and a window's micro-steps read nothing.
TEST(Accumulation, TheBoundaryReadsOnceAfterTheReducerSettles) {
  struct Recording : optim::PartialSumReducer {
    int64_t sums = 0, settles = 0, reads_at_settle = -1;
    void sum(Tensor&) override { ++sums; }
    void settle() override {
      ++settles;
      reads_at_settle = host_waits().reads;
    }
  } reducer;
  AccumulatorOptions options;
  options.loss_reducer = &reducer;
  Rig s = make_setup(DType::kFloat64, Device::cpu(), 64, options);
  const HostWaits before = host_waits();
  s.acc->begin_window(64);
  for (int64_t start : {0, 32}) {
    s.acc->micro_step(32, [&] { return loss_of(s, range(start, start + 32)); });
  }
  EXPECT_EQ(host_waits().reads, before.reads);
  s.acc->step();
  EXPECT_EQ(reducer.sums, 1);
  EXPECT_EQ(reducer.settles, 1);
  EXPECT_EQ(reducer.reads_at_settle, before.reads);  // nothing read before it
  EXPECT_EQ(host_waits().reads, before.reads + 1);   // then the one read
}

TEST(Accumulation, ReportedLossAndNormDoNotDependOnTheSplit) {
  std::vector<optim::StepResult> results;
  std::vector<Tensor> params;
  for (int64_t k : {1, 2, 4, 8}) {
    AccumulatorOptions options;
    options.max_norm = 0.1;
    Rig s = make_setup(DType::kFloat32, Device::cpu(), 64, options);
    const auto windows = optim::plan_windows(64, optim::resolve_batch({64, 0, k, 1}));
    ASSERT_EQ(windows.size(), 1u);
    results.push_back(s.acc->accumulate_window(windows[0], [&](const optim::MicroBatch& mb) {
      return loss_of(s, range(mb.start, mb.start + mb.count));
    }));
    params.push_back(s.arena->masters().clone());
  }
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_NEAR(results[i].loss, results[0].loss, 1e-6 * results[0].loss);
    EXPECT_NEAR(results[i].grad_norm, results[0].grad_norm, 1e-5 * results[0].grad_norm);
    EXPECT_LT(max_rel_error(params[i], params[0]), 1e-6);
    EXPECT_EQ(results[i].items, 64);
  }
  EXPECT_GT(results[0].grad_norm, 0.1) << "the test should exercise clipping";
}

TEST(Accumulation, EvaluationInsideAWindowDoesNotStep) {
  Rig s = make_setup(DType::kFloat32);
  s.acc->begin_window(64);
  s.acc->micro_step(32, [&] { return loss_of(s, range(0, 32)); });
  const Tensor grads = s.arena->grads().clone();
  {
    NoGradGuard eval;
    argmax((*s.model)(s.x));
  }
  EXPECT_EQ(s.acc->step_clock(), 0);
  EXPECT_EQ(max_rel_error(s.arena->grads(), grads), 0.0);
  expect_error<ValueError>([&] { s.acc->step(); }, {"32 of 64"});
  s.acc->micro_step(32, [&] { return loss_of(s, range(32, 64)); });
  s.acc->step();
  EXPECT_EQ(s.acc->step_clock(), 1);
}

TEST(Accumulation, ScheduleTicksOncePerOptimizerStep) {
  AccumulatorOptions options;
  options.base_lr = 0.02;
  options.schedule = {optim::ScheduleKind::kConstant, 20, 0, 0};
  Rig s = make_setup(DType::kFloat32, Device::cpu(), 64, options);
  const auto batch = optim::resolve_batch({0, 4, 4, 1});  // 16 per window, 4 windows per epoch
  int micro_steps = 0;
  std::vector<double> lrs;
  while (micro_steps < 40) {
    for (const auto& w : optim::plan_windows(64, batch)) {
      lrs.push_back(s.acc
                        ->accumulate_window(w,
                                            [&](const optim::MicroBatch& mb) {
                                              ++micro_steps;
                                              return loss_of(s,
                                                             range(mb.start, mb.start + mb.count));
                                            })
                        .lr);
      if (micro_steps == 40) break;
    }
  }
  EXPECT_EQ(s.acc->step_clock(), 10);
  ASSERT_EQ(lrs.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_DOUBLE_EQ(lrs[i], 0.02 * (i + 1) / 20.0);
}

TEST(Schedule, FactorsAndScaling) {
  optim::Schedule cosine{optim::ScheduleKind::kCosine, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(cosine.factor(0), 0.1);
  EXPECT_DOUBLE_EQ(cosine.factor(9), 1.0);
  EXPECT_DOUBLE_EQ(cosine.factor(10), 1.0);
  EXPECT_NEAR(cosine.factor(60), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(cosine.factor(110), 0.1);
  EXPECT_DOUBLE_EQ(cosine.factor(500), 0.1);
  EXPECT_DOUBLE_EQ(optim::Schedule{}.factor(1000), 1.0);
  // The warmup applies to either kind: a constant schedule ramps too.
  const optim::Schedule constant{optim::ScheduleKind::kConstant, 4, 0, 0};
  EXPECT_DOUBLE_EQ(constant.factor(0), 0.25);
  EXPECT_DOUBLE_EQ(constant.factor(3), 1.0);
  EXPECT_DOUBLE_EQ(constant.factor(100), 1.0);
  expect_error<ValueError>([] { optim::Schedule::parse("warmup"); },
                           {"'warmup'", "constant or cosine", "warmup applies to either"});
  EXPECT_DOUBLE_EQ(optim::scale_lr(1e-3, 128, 32, optim::LrScaling::kLinear), 4e-3);
  EXPECT_DOUBLE_EQ(optim::scale_lr(1e-3, 128, 32, optim::LrScaling::kSqrt), 2e-3);
  EXPECT_DOUBLE_EQ(optim::scale_lr(1e-3, 128, 32, optim::LrScaling::kNone), 1e-3);
  expect_error<ValueError>([] { optim::parse_lr_scaling("cubic"); }, {"cubic", "sqrt"});
}

TEST(Batch, ResolvesAnyTwoOfThree) {
  EXPECT_EQ(optim::resolve_batch({128, 32, 0, 1}).accum_steps, 4);
  EXPECT_EQ(optim::resolve_batch({128, 0, 4, 1}).micro_batch, 32);
  EXPECT_EQ(optim::resolve_batch({0, 32, 4, 1}).batch, 128);
  EXPECT_EQ(optim::resolve_batch({128, 32, 4, 1}).str(),
            "effective batch 128 = 1 rank x micro-batch 32 x 4 accumulation steps");
  expect_error<ValueError>(
      [] {
        optim::resolve_batch({128, 32, 3, 1});
      },
      {"inconsistent", "128", "32", "3", "96"});
  expect_error<ValueError>([] { optim::resolve_batch({100, 32, 0, 1}); }, {"100", "32"});
  expect_error<ValueError>([] { optim::resolve_batch({128, 0, 0, 1}); }, {"at least two"});
}

// Memory follows the micro-batch: live bytes return to the baseline after every micro-step,
// the peak for k = 8 equals the peak for k = 1 at the same micro-batch and is far below one
// batch of 8b, and after the first window nothing is taken from the system.
class Memory : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) ACCRUE_REQUIRE_CUDA();
  }
};

optim::MemoryStats run_steps(Device device, int64_t micro, int64_t k, int windows,
                             std::vector<size_t>* live_after = nullptr,
                             std::vector<int64_t>* system = nullptr) {
  Rig s = make_setup(DType::kFloat32, device, 512);
  const auto plan =
      optim::plan_windows(micro * k * windows, optim::resolve_batch({0, micro, k, 1}));
  for (const auto& w : plan) {
    s.acc->begin_window(w.samples);
    for (const auto& mb : w.micro) {
      s.acc->micro_step(mb.count, [&] {
        return cross_entropy((*s.model)(s.x.narrow(mb.start, mb.count)),
                             s.y.narrow(mb.start, mb.count));
      });
      if (live_after) live_after->push_back(s.acc->last_micro_live_bytes());
    }
    s.acc->step();
    if (system) system->push_back(allocator_for(device).stats().system_allocs);
  }
  return s.acc->memory();
}

TEST_P(Memory, FollowsTheMicroBatchNotTheWindow) {
  const Device device = GetParam();
  std::vector<size_t> live;
  std::vector<int64_t> system;
  const optim::MemoryStats k8 = run_steps(device, 32, 8, 2, &live, &system);
  for (size_t i = 1; i < live.size(); ++i) EXPECT_EQ(live[i], live[0]) << "micro-step " << i;
  EXPECT_EQ(system[1], system[0]) << "the second window must take nothing from the system";
  const optim::MemoryStats k1 = run_steps(device, 32, 1, 2);
  const optim::MemoryStats full = run_steps(device, 256, 1, 1);
  EXPECT_EQ(k8.peak_activation_bytes, k1.peak_activation_bytes);
  EXPECT_EQ(k8.peak_bytes - k8.baseline_bytes, k1.peak_bytes - k1.baseline_bytes);
  EXPECT_GT(full.peak_activation_bytes, 4 * k8.peak_activation_bytes);
}

INSTANTIATE_TEST_SUITE_P(Devices, Memory, ::testing::Values(Device::cpu(), Device::cuda(0)),
                         [](const auto& info) { return info.param.is_cpu() ? "cpu" : "cuda"; });

TEST(Accumulation, IdenticalRunsAreBitwiseIdentical) {
  auto run = [] {
    Rig s = make_setup(DType::kFloat32, Device::cpu(), 64, {1.0, 1e-2, {}});
    for (const auto& w : optim::plan_windows(64, optim::resolve_batch({16, 4, 0, 1}))) {
      s.acc->accumulate_window(w, [&](const optim::MicroBatch& mb) {
        return cross_entropy((*s.model)(s.x.narrow(mb.start, mb.count)),
                             s.y.narrow(mb.start, mb.count));
      });
    }
    return s.arena->masters().to_vector<float>();
  };
  const auto a = run(), b = run();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace accrue::testing
