// Pipeline schedules in one process: the actions of GPipe and 1F1B per stage, the micro-batches
// each holds in flight, the bubble worked out on paper against (P - 1) / (k + P - 1), a deadlock
// recognised, and one stage (P = 1) running a window through its tapes to the gradient of plain
// accumulation. The schedules across ranks are tested under mpiexec in test_dist.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "distributed/pipeline.h"
#include "nn/mlp.h"
#include "test_util.h"

namespace accrue {
namespace {

using distributed::PipelineAction;
using distributed::PipelineSchedule;

std::string describe(const std::vector<PipelineAction>& actions) {
  std::string out;
  for (const PipelineAction& a : actions) {
    out += (out.empty() ? "" : " ") + std::string(a.forward ? "F" : "B") + std::to_string(a.micro);
  }
  return out;
}

TEST(Pipeline, ScheduleActionsPerStage) {
  const auto actions = [](PipelineSchedule s, int stages, int stage, int k) {
    return describe(distributed::schedule_actions(s, stages, stage, k));
  };
  EXPECT_EQ(actions(PipelineSchedule::kGPipe, 2, 0, 4), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(actions(PipelineSchedule::kGPipe, 2, 1, 4), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(actions(PipelineSchedule::kOneFOneB, 2, 0, 4), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(actions(PipelineSchedule::kOneFOneB, 2, 1, 4), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(actions(PipelineSchedule::kOneFOneB, 4, 0, 6), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  // A short last window: fewer micro-batches than stages.
  EXPECT_EQ(actions(PipelineSchedule::kOneFOneB, 4, 0, 2), "F0 F1 B0 B1");
  EXPECT_EQ(actions(PipelineSchedule::kOneFOneB, 4, 3, 2), "F0 B0 F1 B1");
}

// Every micro-batch forward once and backward once, each kind in order, a backward after its
// forward; in flight: GPipe the whole window, 1F1B at most P - s on stage s.
TEST(Pipeline, EverySchedulesEachMicroBatchOnceAndBoundsWhatIsInFlight) {
  for (const auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::kOneFOneB}) {
    for (int stages = 1; stages <= 4; ++stages) {
      for (int k = 1; k <= 16; ++k) {
        for (int s = 0; s < stages; ++s) {
          const auto actions = distributed::schedule_actions(schedule, stages, s, k);
          SCOPED_TRACE(describe(actions));
          ASSERT_EQ(actions.size(), 2u * k);
          int forwards = 0, backwards = 0;
          for (const PipelineAction& a : actions) {
            if (a.forward) {
              EXPECT_EQ(a.micro, forwards++);
            } else {
              EXPECT_EQ(a.micro, backwards++);
              EXPECT_LT(a.micro, forwards);
            }
          }
          const int expected = schedule == PipelineSchedule::kGPipe ? k : std::min(stages - s, k);
          EXPECT_EQ(distributed::max_in_flight(actions), expected);
        }
      }
    }
  }
}

// With forward and backward of equal cost, every stage of either schedule is idle for
// (P - 1) / (k + P - 1) of the window: the bubble a larger k shrinks.
TEST(Pipeline, TheBubbleOnPaperIsPMinusOneOverKPlusPMinusOne) {
  for (const auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::kOneFOneB}) {
    for (int stages = 1; stages <= 4; ++stages) {
      for (int k : {1, 2, 4, 8, 16}) {
        const auto sim = distributed::simulate_pipeline(schedule, stages, k);
        const double bubble = double(stages - 1) / (k + stages - 1);
        EXPECT_DOUBLE_EQ(sim.makespan, 2.0 * (k + stages - 1));
        for (const double idle : sim.idle_fraction) EXPECT_NEAR(idle, bubble, 1e-12);
      }
    }
  }
  // Backward twice the forward (a GEMM layer's two products): the same makespan for both.
  EXPECT_DOUBLE_EQ(
      distributed::simulate_pipeline(PipelineSchedule::kGPipe, 4, 8, 1, 2).makespan,
      distributed::simulate_pipeline(PipelineSchedule::kOneFOneB, 4, 8, 1, 2).makespan);
}

TEST(Pipeline, ADeadlockingOrderIsRecognisedAndBadArgumentsNamed) {
  // Stage 0 waits for stage 1's backward of micro-batch 0 before it sends micro-batch 1, and
  // stage 1 wants micro-batch 1's forward first.
  const std::vector<std::vector<PipelineAction>> crossed = {
      {{true, 0}, {false, 0}, {true, 1}, {false, 1}},
      {{true, 0}, {true, 1}, {false, 0}, {false, 1}}};
  testing::expect_error<ValueError>([&] { distributed::simulate_pipeline(crossed); },
                                    {"[simulate_pipeline]", "deadlocks", "2 stages"});
  testing::expect_error<ValueError>(
      [&] {
        distributed::simulate_pipeline({{{true, 0}, {true, 0}}});
      },
      {"[simulate_pipeline]", "stage 0", "once forward and once backward"});
  testing::expect_error<ValueError>(
      [] { distributed::schedule_actions(PipelineSchedule::kGPipe, 2, 2, 4); },
      {"[schedule_actions]", "stage 2 of 2"});
  testing::expect_error<ValueError>(
      [] { distributed::schedule_actions(PipelineSchedule::kGPipe, 2, 0, 0); },
      {"[schedule_actions]", "0 micro-batches"});
  testing::expect_error<ValueError>([] { distributed::parse_pipeline_schedule("interleaved"); },
                                    {"[pipeline]", "'interleaved'", "gpipe or 1f1b"});
  EXPECT_EQ(distributed::parse_pipeline_schedule("1f1b"), PipelineSchedule::kOneFOneB);
}

// Stages by parameter count: contiguous, each with at least one layer, cut near equal shares.
TEST(Pipeline, StagesAreBalancedByParametersAndNeverEmpty) {
  using V = std::vector<int>;
  EXPECT_EQ(distributed::balance_stages({100, 1, 1, 1}, 4), (V{0, 1, 2, 3}));
  EXPECT_EQ(distributed::balance_stages({1, 1, 1, 100}, 2), (V{0, 0, 0, 1}));
  EXPECT_EQ(distributed::balance_stages({5, 5, 5, 5, 5}, 5), (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(distributed::balance_stages({0, 0, 10}, 2), (V{0, 0, 1}));
  EXPECT_EQ(distributed::balance_stages({0, 100, 1, 1}, 4), (V{0, 1, 2, 3}));
  EXPECT_EQ(distributed::balance_stages({10, 10, 10, 10, 10, 10}, 3), (V{0, 0, 1, 1, 2, 2}));
  // The G2P GPT: small embeddings, four equal blocks, a small head.
  EXPECT_EQ(distributed::balance_stages({20, 200, 200, 200, 200, 1}, 2), (V{0, 0, 0, 1, 1, 1}));
  testing::expect_error<ValueError>(
      [] {
        distributed::balance_stages({1, 2}, 3);
      },
      {"[pipeline]", "3 stages", "has 2"});
}

// One stage (P = 1, the world of one process) runs a window of 5 micro-batches through a tape
// each: the gradient equals plain accumulation's bit for bit, every activation is freed, and
// GPipe holds all 5 in flight while 1F1B holds one.
TEST(Pipeline, OneStageRunsTheWindowToPlainAccumulationsGradient) {
  nn::manual_seed(11);
  nn::MLP model({6, 10, 8, 3}, nn::activation<nn::ReLU>(), DType::kFloat64);
  constexpr int k = 5;
  std::vector<Tensor> inputs, labels;
  for (int m = 0; m < k; ++m) {
    const int64_t rows = m == k - 1 ? 2 : 4;  // a short last micro-batch
    inputs.push_back(testing::random({rows, 6}, 30 + m));
    std::vector<int32_t> y;
    for (int64_t i = 0; i < rows; ++i) y.push_back(int32_t((m + i) % 3));
    labels.push_back(Tensor::from_vector<int32_t>({rows}, y));
  }
  const double seed = 1.0 / 18;  // 4 * 4 + 2 items
  for (int m = 0; m < k; ++m) backward(cross_entropy(model(inputs[m]), labels[m]), seed);
  std::vector<Tensor> expected;
  for (Tensor& p : model.parameters()) {
    expected.push_back(p.grad().clone());
    p.grad().zero_();
  }
  const auto single = distributed::make_single_process();
  distributed::PipelineStage stage(*single, DType::kFloat64, Device::cpu());
  distributed::PipelineStage::Functions f;
  f.input = [&](int m) { return inputs[m]; };
  f.forward = [&](const Tensor& x, int) { return model(x); };
  f.loss = [&](const Tensor& y, int m) { return cross_entropy(y, labels[m]); };
  CachingAllocator& alloc = allocator_for(Device::cpu());
  size_t peak[2] = {0, 0};
  for (const auto schedule : {PipelineSchedule::kGPipe, PipelineSchedule::kOneFOneB}) {
    SCOPED_TRACE(distributed::schedule_name(schedule));
    const size_t before = alloc.stats().live_bytes;
    const auto stats = stage.run_schedule(schedule, k, full({}, seed, DType::kFloat64), f);
    EXPECT_EQ(alloc.stats().live_bytes, before);
    EXPECT_EQ(tape_size(), 0u);
    EXPECT_EQ(stats.max_in_flight, schedule == PipelineSchedule::kGPipe ? k : 1);
    EXPECT_EQ(stats.wait_seconds, 0.0);  // nobody to wait for
    peak[schedule == PipelineSchedule::kGPipe ? 0 : 1] = stats.peak_activation_bytes;
    const auto params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(testing::max_rel_error(params[i].grad(), expected[i]), 0.0) << i;
      params[i].grad().zero_();
    }
  }
  EXPECT_GT(peak[0], peak[1]);  // GPipe holds every micro-batch's activations at once
}

}  // namespace
}  // namespace accrue
