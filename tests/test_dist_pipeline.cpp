// Pipeline stages beside data parallelism: CTest runs this under `mpiexec -n 4` (oversubscribed
// on any machine), so every test runs on the four ranks. Two data-parallel replicas of a
// two-stage pipeline, and one pipeline of four stages, train the MLP in float64 to the per-step
// losses, norms and final weights of one process with the same windows.
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include "dist_util.h"
#include "distributed/communicator.h"
#include "mnist_fixture.h"
#include "optim/safetensors.h"
#include "test_util.h"

namespace accrue {
namespace {

using testing::Recorded;
using testing::train_recorded;

using testing::comm;

// Trains `pipelined` on the four ranks and `single` (the same run, one process) and compares.
void expect_same_training(mnist::Config pipelined, mnist::Config single, const std::string& name) {
  const auto data = testing::make_dataset("dist4-" + name, 1001, 64);
  pipelined.data = single.data = data.string();
  pipelined.save = (data / "pipelined.safetensors").string();
  single.save = (data / "single.safetensors").string();
  const auto one = distributed::make_single_process();
  single.comm = one.get();
  pipelined.quiet = false;  // rank 0's log: its batch line names processes and stages (D17)
  std::ostringstream log;
  const Recorded r = train_recorded(pipelined, log);
  if (comm().rank() == 0) {
    EXPECT_NE(log.str().find(str_cat("(4 processes: ", 4 / pipelined.pipeline, " data-parallel x ",
                                     pipelined.pipeline, " pipeline stages)")),
              std::string::npos)
        << log.str();
  }
  const Recorded expected = train_recorded(single, std::cout);
  testing::expect_same_steps(r, expected, 1e-10);
  EXPECT_EQ(r.test_accuracy, expected.test_accuracy);
  if (comm().rank() == 0) testing::expect_same_weights(pipelined.save, single.save, 1e-10);
  comm().barrier();
}

mnist::Config base() {
  mnist::Config c;
  c.quiet = true;
  c.seed = 13;
  c.epochs = 2;
  c.threads = 1;
  c.precision = train::Precision::kFp64;
  c.micro_batch = 32;
  return c;
}

TEST(DistPipeline, TheLauncherStartedFourRanks) {
  ASSERT_EQ(comm().world_size(), 4) << "run under mpiexec -n 4";
}

// Ranks {0, 1} and {2, 3} are two pipelines of two stages; ranks {0, 2} and {1, 3} all-reduce
// their stage's gradient. 2 replicas x 32 x k 4 = one process's 32 x k 8; 1001 samples leave a
// last window of 233, shared unevenly.
TEST(DistPipeline, TwoReplicasOfTwoStagesEqualOneProcess) {
  mnist::Config p = base(), one = base();
  p.hidden = one.hidden = {40, 24};
  p.pipeline = 2;
  p.pipeline_schedule = distributed::PipelineSchedule::kOneFOneB;
  p.accum_steps = 4;
  one.accum_steps = 8;
  expect_same_training(p, one, "2x2");
}

// Four stages, one layer each, 1F1B: stage s holds at most 4 - s micro-batches in flight.
TEST(DistPipeline, FourStagesEqualOneProcessAndBoundWhatIsInFlight) {
  mnist::Config p = base(), one = base();
  p.hidden = one.hidden = {40, 32, 24};
  p.pipeline = 4;
  p.accum_steps = one.accum_steps = 6;
  expect_same_training(p, one, "4");
  const auto data = testing::make_dataset("dist4-4", 1001, 64);
  p.data = data.string();
  const Recorded r = train_recorded(p, std::cout);
  ASSERT_EQ(r.stages.size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(r.stages[size_t(s)].max_in_flight, 4 - s) << s;
}

}  // namespace
}  // namespace accrue
