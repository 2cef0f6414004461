// ZeRO stages 1, 2 and 3 with gradient accumulation, under `mpiexec -n 2` and `-n 4`
// (tests/CMakeLists.txt): every allowed combination of stage and reduce policy, at k = 1 and
// k > 1, trains in float64 to one process's per-step loss and norm and final weights (1e-10
// relative), with micro-batches of unequal counts on the ranks in the short last window; the
// 16-bit precisions match data parallelism's own run within a stated tolerance; each resumes bit
// for bit; the memory each rank holds and the bytes it hands the collectives follow the
// formulas of docs/zero.md.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dist_util.h"
#include "distributed/communicator.h"
#include "g2p.h"
#include "g2p_fixture.h"
#include "mnist_fixture.h"
#include "test_util.h"

namespace accrue {
namespace {

using testing::Recorded;
using testing::train_recorded;

using testing::comm;
using testing::expect_same_on_every_rank;

// A ZeRO setting: the stage, for stage 2 the reduce policy, and the offloaded optimizer.
struct Zero {
  int stage;
  std::optional<distributed::ZeroReduce> reduce;
  bool offload = false;
  std::string str() const {
    return str_cat("--zero ", stage,
                   reduce ? str_cat(" --zero-reduce ", zero_reduce_name(*reduce)) : std::string(),
                   offload ? " --offload-optimizer" : "");
  }
};

const Zero kCombinations[] = {{1, std::nullopt},
                              {2, distributed::ZeroReduce::kBoundary},
                              {2, distributed::ZeroReduce::kMicroStep},
                              {3, std::nullopt},
                              {1, std::nullopt, true},
                              {2, distributed::ZeroReduce::kBoundary, true},
                              {2, distributed::ZeroReduce::kMicroStep, true},
                              {3, std::nullopt, true}};

// 929 samples: 7 windows of 128, then 33. On 2 ranks with micro-batches of 16 the last window
// gives rank 0 two micro-batches (16 + 1) and rank 1 one (16): ZeRO-2's reduce-scatter at every
// micro-step must still meet.
constexpr int64_t kSamples = 929, kBatch = 128;

mnist::Config mlp_config(const std::filesystem::path& data, const std::string& precision) {
  mnist::Config c;
  c.data = data.string();
  c.hidden = {48, 24};
  c.quiet = true;
  c.seed = 3;
  c.epochs = 2;  // 16 steps
  c.threads = 1;
  c.precision = train::parse_precision(precision);
  c.batch = kBatch;
  return c;
}

template <typename C>
void set_zero(C& c, const Zero& z) {
  c.zero = z.stage;
  c.zero_reduce = z.reduce;
  c.offload_optimizer = z.offload;
}

// The per-step losses and norms within `tolerance` relative.
void expect_relative_steps(const Recorded& got, const Recorded& one, double tolerance) {
  ASSERT_EQ(got.step_losses.size(), one.step_losses.size());
  for (size_t i = 0; i < got.step_losses.size(); ++i) {
    EXPECT_NEAR(got.step_losses[i], one.step_losses[i], tolerance * one.step_losses[i]) << i;
    EXPECT_NEAR(got.step_grad_norms[i], one.step_grad_norms[i], tolerance * one.step_grad_norms[i])
        << i;
  }
}

// The k values a test runs: `ci`, or with ACCRUE_ZERO_MATRIX set (scripts/zero-matrix.sh) every
// power of two that splits a rank's share of the batch, `share`.
std::vector<int64_t> accumulation_steps(std::vector<int64_t> ci, int64_t share) {
  if (std::getenv("ACCRUE_ZERO_MATRIX") == nullptr) return ci;
  std::vector<int64_t> all;
  for (int64_t k = 1; k <= share && k <= 16; k *= 2) {
    if (share % k == 0) all.push_back(k);
  }
  return all;
}

// The MNIST MLP in float64: each combination at k = 1 and k > 1 equals one process (micro-batch
// 32, k 4) to 1e-10.
TEST(Zero, MlpEveryCombinationEqualsOneProcessInFp64) {
  const int world = comm().world_size();
  const auto data = testing::make_dataset("zero-mlp", kSamples, 64);
  mnist::Config c = mlp_config(data, "fp64");
  const auto single = distributed::make_single_process();
  mnist::Config one = c;
  one.comm = single.get();
  one.micro_batch = 32;
  one.save = (data / "one.safetensors").string();
  const Recorded reference = train_recorded(one, std::cout);
  ASSERT_EQ(reference.step_losses.size(), 16u);
  for (const int64_t k : accumulation_steps({1, kBatch / (16 * world)}, kBatch / world)) {
    for (const Zero& z : kCombinations) {
      SCOPED_TRACE(str_cat(world, " ranks, k ", k, ", ", z.str()));
      mnist::Config r = c;
      set_zero(r, z);
      r.micro_batch = kBatch / (world * k);
      r.save = (data / "zero.safetensors").string();
      const Recorded got = train_recorded(r, std::cout);
      expect_relative_steps(got, reference, 1e-10);
      expect_same_on_every_rank(got.parameter_hash);
      if (comm().rank() == 0) {
        testing::expect_same_weights(r.save, one.save, 1e-10);
      }
      comm().barrier();
    }
  }
}

// The G2P GPT (its head tied to the token embedding: one parameter, one shard) in float64 on
// variable-length sequences normalised by their target tokens: each combination equals one
// process to 1e-10, at k = 1 and k = 2.
TEST(Zero, G2pEveryCombinationEqualsOneProcessInFp64) {
  const int world = comm().world_size();
  const std::filesystem::path dir =
      testing::shared_g2p_fixture(comm(), str_cat("accrue-zero-g2p-", world));
  g2p::Config c;
  c.data = (dir / "dict.txt").string();
  c.layers = 2, c.heads = 2, c.width = 8, c.quiet = true;
  c.precision = train::Precision::kFp64;
  c.epochs = 6, c.warmup = 0, c.threads = 1;  // 18 steps
  c.batch = 64;
  const auto train = [&](g2p::Config r, const std::string& tag, std::vector<double>& losses) {
    r.save = (dir / (tag + "-" + std::to_string(comm().rank()) + ".safetensors")).string();
    train::Callbacks callbacks;
    callbacks.on_step = [&](const train::StepEvent& e) {
      losses.push_back(e.loss);
      losses.push_back(e.grad_norm);
    };
    std::ostringstream out;
    const train::Summary s = g2p::train(r, out, callbacks);
    expect_same_on_every_rank(s.parameter_hash);
    return r.save;
  };
  const auto single = distributed::make_single_process();
  g2p::Config one = c;
  one.comm = single.get();
  one.micro_batch = 16;
  std::vector<double> reference;
  const std::string one_file = train(one, "one", reference);
  ASSERT_GT(reference.size(), 8u);
  for (const int64_t k : accumulation_steps({1, 2}, c.batch / world)) {
    for (const Zero& z : kCombinations) {
      SCOPED_TRACE(str_cat(world, " ranks, k ", k, ", ", z.str()));
      g2p::Config r = c;
      set_zero(r, z);
      r.micro_batch = c.batch / (world * k);
      std::vector<double> got;
      const std::string file = train(r, "zero", got);
      ASSERT_EQ(got.size(), reference.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], reference[i], 1e-10 * std::abs(reference[i])) << i;
      }
      if (comm().rank() == 0) testing::expect_same_weights(file, one_file, 1e-10);
      comm().barrier();
    }
  }
}

// ZeRO-3's prefetch changes when a gather starts, not what it brings: the G2P GPT (its tied head
// gathered ahead of both uses) in bfloat16, whose working copy is gathered in 16 bits, and the
// MLP with the offloaded optimizer in float32 train to the same bits and hand the collectives
// the same bytes with every prefetch policy; the forward's prefetch holds no more at the peak
// than gathering on demand (the backward's layer and its gradient are the larger).
TEST(Zero, ThirdStagePrefetchChangesNoBit) {
  const int world = comm().world_size();
  const std::filesystem::path dir =
      testing::shared_g2p_fixture(comm(), str_cat("accrue-zero3-prefetch-", world));
  const auto policies = {distributed::ZeroPrefetch::kNone, distributed::ZeroPrefetch::kForward,
                         distributed::ZeroPrefetch::kForwardAndBackward};
  std::vector<train::Summary> g2p_runs;
  for (const distributed::ZeroPrefetch p : policies) {
    g2p::Config c;
    c.data = (dir / "dict.txt").string();
    c.layers = 2, c.heads = 2, c.width = 64, c.quiet = true;
    c.precision = train::Precision::kBf16;
    c.epochs = 2, c.warmup = 0, c.threads = 1, c.batch = 64;
    c.micro_batch = c.batch / (world * 2);
    c.zero = 3;
    c.zero_prefetch = p;
    std::ostringstream out;
    g2p_runs.push_back(g2p::train(c, out, {}));
  }
  const auto data = testing::make_dataset("zero3-prefetch", kSamples, 64);
  std::vector<Recorded> mlp_runs;
  for (const distributed::ZeroPrefetch p : policies) {
    mnist::Config c = mlp_config(data, "fp32");
    set_zero(c, Zero{3, std::nullopt, true});
    c.zero_prefetch = p;
    c.micro_batch = kBatch / (world * 2);
    c.max_steps = 6;
    mlp_runs.push_back(train_recorded(c, std::cout));
  }
  for (size_t i = 1; i < g2p_runs.size(); ++i) {
    SCOPED_TRACE(distributed::zero_prefetch_name(*(policies.begin() + i)));
    EXPECT_EQ(g2p_runs[i].parameter_hash, g2p_runs[0].parameter_hash);
    EXPECT_EQ(g2p_runs[i].footprint.collectives.all_gather,
              g2p_runs[0].footprint.collectives.all_gather);
    EXPECT_EQ(mlp_runs[i].parameter_hash, mlp_runs[0].parameter_hash);
    EXPECT_EQ(mlp_runs[i].step_losses, mlp_runs[0].step_losses);
  }
  EXPECT_EQ(g2p_runs[1].peak_bytes, g2p_runs[0].peak_bytes);
  EXPECT_GT(g2p_runs[2].peak_bytes, g2p_runs[0].peak_bytes);
  comm().barrier();
}

// In float32, bfloat16 and float16 (with its loss scale) ZeRO sums each element in another
// order than data parallelism: over the ranks per micro-step and then over the micro-steps
// (ZeRO-2's micro-step policy, ZeRO-3) where data parallelism sums the micro-steps first, and at
// 4 ranks MPI's reduce-scatter may add the ranks in another order than its all-reduce. So a step
// is not bitwise: a float32 sum differs in its last bits (2^-24 relative), which 16 Adam steps
// carry into the loss at ~1e-7; the bound is 1e-5. The 16-bit runs compute with weights rounded
// to 8 or 11 bits, where one flipped last bit of a master moves a working weight by up to
// 2^-8: bound 1e-3. The loss scale takes the same steps, and every rank ends with the same
// bits.
TEST(Zero, SixteenBitAndFloat32TrainAsDataParallelism) {
  const int world = comm().world_size();
  const auto data = testing::make_dataset("zero-precisions", kSamples, 64);
  for (const auto& [precision, tolerance] :
       {std::pair<const char*, double>{"fp32", 1e-5}, {"bf16", 1e-3}, {"fp16", 1e-3}}) {
    mnist::Config c = mlp_config(data, precision);
    c.micro_batch = kBatch / (world * 2);
    const Recorded plain = train_recorded(c, std::cout);
    for (const Zero& z : kCombinations) {
      SCOPED_TRACE(str_cat(precision, ", ", z.str()));
      mnist::Config r = c;
      set_zero(r, z);
      const Recorded got = train_recorded(r, std::cout);
      expect_relative_steps(got, plain, tolerance);
      EXPECT_EQ(got.step_loss_scales, plain.step_loss_scales);
      expect_same_on_every_rank(got.parameter_hash);
    }
  }
}

// Trains `c` to step 5 with a checkpoint, then resumes it to step 10: the bits of the run that
// was never stopped.
TEST(Zero, EachCombinationResumesBitForBit) {
  const int world = comm().world_size();
  const auto data = testing::make_dataset("zero-resume", kSamples, 64);
  for (const Zero& z : kCombinations) {
    SCOPED_TRACE(z.str());
    mnist::Config c = mlp_config(data, "fp32");
    set_zero(c, z);
    c.micro_batch = kBatch / (world * 2);
    c.max_steps = 10;
    const Recorded whole = train_recorded(c, std::cout);
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / str_cat("accrue-zero-resume-", world);
    const Recorded resumed = testing::checkpoint_and_resume(c, dir);
    EXPECT_EQ(resumed.parameter_hash, whole.parameter_hash);
    expect_same_on_every_rank(resumed.parameter_hash);
    if (z.stage == 3) {
      EXPECT_TRUE(std::filesystem::exists(dir / str_cat("rank-", comm().rank(), "-of-", world) /
                                          "step-0000000005.json"));
    }
    // Another stage is refused, naming both.
    mnist::Config other = c;
    set_zero(other, z.stage == 1 ? Zero{2, distributed::ZeroReduce::kBoundary, z.offload}
                                 : Zero{1, {}, z.offload});
    if (z.stage == 3) {
      testing::expect_error<FileError>([&] { train_recorded(other, std::cout); },
                                       {"per-rank checkpoints", "--zero 3", "--zero 1"});
      other = c;
      // A world of one on each rank: another rank count.
      const auto single = distributed::make_single_process();
      other.comm = single.get();
      testing::expect_error<FileError>(
          [&] { train_recorded(other, std::cout); },
          {"rank 0 of 1", str_cat("the checkpoints of ", world, " ranks"), "on 1 ranks"});
    } else {
      testing::expect_error<ValueError>([&] { train_recorded(other, std::cout); },
                                        {"zero = ", "this run has"});
    }
    comm().barrier();
  }
}

// ZeRO-3's per-rank checkpoints: a finished run resumed evaluates the checkpoint's weights (not
// the layers gathered before the resume), and ranks whose newest checkpoints differ (one stopped
// while writing) are refused, naming both steps.
TEST(Zero, ThirdStageResumesFromTheStepEveryRankHas) {
  const int world = comm().world_size();
  const auto data = testing::make_dataset("zero3-resume", kSamples, 64);
  mnist::Config c = mlp_config(data, "fp32");
  set_zero(c, Zero{3, std::nullopt});
  c.micro_batch = kBatch / (world * 2);
  c.max_steps = 10;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / str_cat("accrue-zero3-resume-", world);
  if (comm().rank() == 0) std::filesystem::remove_all(dir);
  comm().barrier();
  c.checkpoint = dir.string();
  c.checkpoint_every = 5;
  const Recorded whole = train_recorded(c, std::cout);
  c.resume = dir.string();
  const Recorded again = train_recorded(c, std::cout);  // at step 10 already: evaluates only
  EXPECT_EQ(again.parameter_hash, whole.parameter_hash);
  EXPECT_EQ(again.test_accuracy, whole.test_accuracy);
  comm().barrier();
  if (comm().rank() == 1) {
    for (const char* ext : {".json", ".safetensors"}) {
      std::filesystem::remove(dir / str_cat("rank-1-of-", world) /
                              (std::string("step-0000000010") + ext));
    }
  }
  comm().barrier();
  c.max_steps = 12;
  testing::expect_error<FileError>([&] { train_recorded(c, std::cout); },
                                   {"different steps", "step-10"});
  comm().barrier();
}

// ZeRO-1 and 2 with the offloaded optimizer keep each rank's slice of the masters, of the host
// gradient and of the 16-bit copy on its host, beside its slice of the state: the pinned bytes
// a rank holds are one process's over the rank count (within the few scalars every optimizer
// keeps), in float32 and in bfloat16.
TEST(Zero, OffloadedShardsKeepTheirSliceOfTheMastersOnTheHost) {
  const int world = comm().world_size();
  const auto data = testing::make_dataset("zero-offload-host", kSamples, 64);
  for (const char* precision : {"fp32", "bf16"}) {
    mnist::Config c = mlp_config(data, precision);
    c.hidden = {256};
    c.max_steps = 2;
    c.micro_batch = kBatch / (world * 2);
    c.offload_optimizer = true;
    const auto single = distributed::make_single_process();
    mnist::Config one = c;
    one.comm = single.get();
    const size_t one_host = train_recorded(one, std::cout).host_state_bytes;
    for (const Zero& z :
         {Zero{1, std::nullopt, true}, Zero{2, distributed::ZeroReduce::kBoundary, true}}) {
      SCOPED_TRACE(str_cat(precision, ", ", z.str()));
      mnist::Config r = c;
      set_zero(r, z);
      const size_t host = train_recorded(r, std::cout).host_state_bytes;
      std::cout << precision << " " << z.str() << ": " << host << " of " << one_host << "\n";
      EXPECT_NEAR(static_cast<double>(host), static_cast<double>(one_host) / world, 4096.0);
    }
  }
}

// --memory-budget's baseline is the sharded layout: each ZeRO stage's probes start from less than
// data parallelism's (the optimizer state in slices, then the gradient, then the parameters).
TEST(Zero, TheMemoryBudgetMeasuresTheShardedLayout) {
  const auto data = testing::make_dataset("zero-budget", kSamples, 64);
  std::vector<size_t> baselines;
  for (const int stage : {0, 1, 2, 3}) {
    mnist::Config c = mlp_config(data, "fp32");
    c.hidden = {256};
    c.zero = stage;
    c.memory_budget = int64_t{64} << 20;
    c.max_steps = 2;
    const Recorded r = train_recorded(c, std::cout);
    baselines.push_back(r.memory_baseline_bytes);
    SCOPED_TRACE(str_cat("--zero ", stage));
    EXPECT_GT(r.memory_baseline_bytes, 0u);
  }
  EXPECT_LT(baselines[1], baselines[0]);
  EXPECT_LT(baselines[2], baselines[1]);
  EXPECT_LT(baselines[3], baselines[2]);
}

}  // namespace
}  // namespace accrue
