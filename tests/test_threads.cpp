// The thread policy: results never depend on the thread count (the GEMM cut is fixed by the
// shape, the reductions' order too), so the tuner may switch counts mid-run; and the tuner,
// driven by synthetic timings, picks the faster count, leaves it when it slows down, and checks
// again at growing intervals.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/threads.h"
#include "kernels/backend.h"
#include "kernels/cpu/gemm_cut.h"
#include "mnist_fixture.h"
#include "test_util.h"

namespace accrue {
namespace {

struct ThreadsGuard {  // restores the team size a test changes
  int saved = cpu_threads();
  ~ThreadsGuard() { set_cpu_threads(saved); }
};

// op(a) [M, K] op(b) [K, N] at every layout and the micro-batch and large shapes the cut treats
// differently (m <= 32, m <= 64, k <= 32, the large cut), with beta = 1 as the arena uses it.
TEST(Threads, GemmIsBitwiseTheSameOnOneTwoAndThreeThreads) {
  ThreadsGuard guard;
  const int shapes[][3] = {{32, 512, 784}, {32, 784, 512}, {512, 784, 32},  {64, 256, 128},
                           {10, 128, 32},  {128, 10, 128}, {300, 200, 100}, {7, 5, 3}};
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    for (const auto& s : shapes) {
      for (int trans = 0; trans < 4; ++trans) {
        const bool ta = trans & 1, tb = trans & 2;
        const int64_t m = s[0], n = s[1], k = s[2];
        const Tensor a = ta ? testing::random({k, m}, 1, dtype) : testing::random({m, k}, 1, dtype);
        const Tensor b = tb ? testing::random({n, k}, 2, dtype) : testing::random({k, n}, 2, dtype);
        const Tensor c0 = testing::random({m, n}, 3, dtype);
        std::vector<Tensor> results;
        for (int threads : {1, 2, 3}) {
          set_cpu_threads(threads);
          Tensor c = c0.clone();
          backend_for(Device::cpu()).gemm(ta, tb, 0.5, a, b, 1.0, c);
          results.push_back(c);
        }
        for (size_t i = 1; i < results.size(); ++i) {
          EXPECT_EQ(0, std::memcmp(results[0].raw(), results[i].raw(),
                                   static_cast<size_t>(results[0].nbytes())))
              << dtype_name(dtype) << " " << m << "x" << n << "x" << k << " ta " << ta << " tb "
              << tb << ": " << i + 1 << " threads differ from 1";
        }
      }
    }
  }
}

// The convolution's three passes (samples shared over the team, the filter gradient's chunks
// added in order) and the CNN's other kernels, at the MNIST CNN's shapes and a strided one; in
// float32, and in bfloat16 with the filter gradient into a float32 arena (mixed precision: conv1
// on the direct kernels, conv2 lowered into per-sample products).
TEST(Threads, ConvolutionAndTheCnnKernelsAreBitwiseTheSameOnOneTwoAndThreeThreads) {
  ThreadsGuard guard;
  struct Case {
    int64_t n, c, o, hw;
    Conv2dGeometry g;
  };
  const Case cases[] = {{32, 1, 32, 28, {1, 1, 1, 1, 1, 1}},
                        {32, 32, 64, 14, {1, 1, 1, 1, 1, 1}},
                        {5, 6, 7, 17, {2, 2, 2, 1, 2, 1}}};
  Backend& be = backend_for(Device::cpu());
  for (const auto& [k, dtype] : {std::pair{cases[0], DType::kFloat32},
                                 {cases[1], DType::kFloat32},
                                 {cases[2], DType::kFloat32},
                                 {cases[0], DType::kBFloat16},
                                 {cases[1], DType::kBFloat16},
                                 {cases[2], DType::kBFloat16}}) {
    const int64_t oh = conv2d_out_size(k.hw, 3, k.g.stride_h, k.g.pad_h, k.g.dilation_h);
    const int64_t ow = conv2d_out_size(k.hw, 3, k.g.stride_w, k.g.pad_w, k.g.dilation_w);
    const Tensor x = testing::random({k.n, k.c, k.hw, k.hw}, 1, dtype);
    const Tensor w = testing::random({k.o, k.c, 3, 3}, 2, dtype);
    const Tensor b = testing::random({k.o}, 3, dtype);
    const Tensor dy = testing::random({k.n, k.o, oh, ow}, 4, dtype);
    const Tensor dw0 = testing::random({k.o, k.c, 3, 3}, 5, DType::kFloat32);
    std::vector<std::vector<Tensor>> results;
    for (int threads : {1, 2, 3}) {
      set_cpu_threads(threads);
      Tensor y = Tensor::empty({k.n, k.o, oh, ow}, dtype, Device::cpu());
      Tensor dx = Tensor::empty(x.shape(), dtype, Device::cpu());
      Tensor dw = dw0.clone(), db = Tensor::zeros({k.o}, DType::kFloat32, Device::cpu());
      be.conv2d_forward(x, w, b, k.g, y);
      be.conv2d_backward_data(dy, w, k.g, dx);
      be.conv2d_backward_filter(dy, x, k.g, 1.0, dw, db);
      const Pool2dGeometry pool{2, 2, 2, 2, 0, 0};
      Tensor pooled = Tensor::empty({k.n, k.o, oh / 2, ow / 2}, dtype, Device::cpu());
      Tensor at = Tensor::empty(pooled.shape(), DType::kInt32, Device::cpu());
      Tensor pooled_relu = Tensor::empty(pooled.shape(), dtype, Device::cpu());
      Tensor at_relu = Tensor::empty(pooled.shape(), DType::kInt32, Device::cpu());
      be.max_pool2d(y, pool, false, pooled, at);
      be.max_pool2d(y, pool, true, pooled_relu, at_relu);
      results.push_back({y, dx, dw, db, pooled, at, pooled_relu, at_relu});
    }
    for (size_t t = 1; t < results.size(); ++t) {
      for (size_t i = 0; i < results[0].size(); ++i) {
        EXPECT_EQ(0, std::memcmp(results[0][i].raw(), results[t][i].raw(),
                                 static_cast<size_t>(results[0][i].nbytes())))
            << "output " << i << " of the " << dtype_name(dtype) << " " << k.c << " -> " << k.o
            << " convolution: " << t + 1 << " threads differ from 1";
      }
    }
  }
}

// Group norm fused with the ReLU and pooling (groups shared over the team, the affine gradients
// summed per channel in sample order) at the CNN's two shapes.
TEST(Threads, FusedGroupNormReluPoolIsBitwiseTheSameOnOneTwoAndThreeThreads) {
  ThreadsGuard guard;
  Backend& be = backend_for(Device::cpu());
  const Pool2dGeometry pool{2, 2, 2, 2, 0, 0};
  for (const Shape& shape : {Shape{32, 32, 28, 28}, Shape{32, 64, 14, 14}}) {
    const int64_t n = shape[0], c = shape[1], oh = shape[2] / 2, ow = shape[3] / 2;
    const Tensor x = testing::random(shape, 1, DType::kFloat32);
    const Tensor w = testing::random({c}, 2, DType::kFloat32);
    const Tensor b = testing::random({c}, 3, DType::kFloat32);
    const Tensor dy = testing::random({n, c, oh, ow}, 4, DType::kFloat32);
    std::vector<std::vector<Tensor>> results;
    for (int threads : {1, 2, 3}) {
      set_cpu_threads(threads);
      Tensor y = Tensor::empty({n, c, oh, ow}, DType::kFloat32, Device::cpu());
      Tensor at = Tensor::empty(y.shape(), DType::kInt32, Device::cpu());
      Tensor mean = Tensor::empty({n, 8}, DType::kFloat32, Device::cpu());
      Tensor rstd = Tensor::empty({n, 8}, DType::kFloat32, Device::cpu());
      Tensor dx = Tensor::empty(shape, DType::kFloat32, Device::cpu());
      Tensor dw = Tensor::zeros({c}, DType::kFloat32, Device::cpu());
      Tensor db = Tensor::zeros({c}, DType::kFloat32, Device::cpu());
      be.group_norm_relu_max_pool2d(x, 8, 1e-5, w, b, pool, y, at, mean, rstd);
      be.group_norm_relu_max_pool2d_backward(dy, at, x, 8, mean, rstd, w, pool, dx, 1.0, dw, db);
      results.push_back({y, at, mean, rstd, dx, dw, db});
    }
    for (size_t t = 1; t < results.size(); ++t) {
      for (size_t i = 0; i < results[0].size(); ++i) {
        EXPECT_EQ(0, std::memcmp(results[0][i].raw(), results[t][i].raw(),
                                 static_cast<size_t>(results[0][i].nbytes())))
            << "output " << i << " at " << shape_str(shape) << ": " << t + 1
            << " threads differ from 1";
      }
    }
  }
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A library call that throws inside the team (a oneDNN failure in a block of the cut) reaches
// the caller as that exception, in parallel and on one thread alike, the other calls still run,
// and the thread count is what it was.
TEST(Threads, ALibraryCallThatThrowsReachesTheCallerAndKeepsTheThreadCount) {
  ThreadsGuard guard;
  set_cpu_threads(2);
  for (bool parallel : {true, false}) {
    std::vector<int> ran(8, 0);
    try {
      cpu::for_library_calls(8, parallel, [&](int64_t i) {
        ran[i] = 1;
        if (i == 5) throw BackendError("block 5 failed");
      });
      ADD_FAILURE() << "no exception, parallel " << parallel;
    } catch (const BackendError& e) {
      EXPECT_STREQ(e.what(), "block 5 failed");
    }
    EXPECT_EQ(omp_get_max_threads(), 2) << "parallel " << parallel;
    // in parallel every other call still ran; on one thread the calls after 5 did not
    EXPECT_EQ(std::count(ran.begin(), ran.end(), 1), parallel ? 8 : 6) << "parallel " << parallel;
  }
}

// The whole trainer: --threads 1, 2 and 0 (tuned, switching between 1 and 2 as it probes)
// write the same weights to the byte.
TEST(Threads, TrainingWritesTheSameWeightsWhateverTheThreadCount) {
  ThreadsGuard guard;
  const auto dir = testing::make_dataset("threads", 1024, 64);
  std::vector<std::string> weights;
  for (const char* threads : {"1", "2", "0"}) {
    const auto save = dir / (std::string("w") + threads + ".safetensors");
    const auto r =
        testing::cli({"--data", dir.string(), "--epochs", "3", "--hidden", "96,64", "--threads",
                      threads, "--seed", "3", "--quiet", "--save", save.string()});
    ASSERT_EQ(r.status, 0) << r.err;
    weights.push_back(file_bytes(save));
  }
  EXPECT_EQ(weights[0], weights[1]) << "--threads 2 differs from --threads 1";
  EXPECT_EQ(weights[0], weights[2]) << "--threads 0 differs from --threads 1";
}

// Options for an idle machine: the tuner's look at other processes' load (busy_cores) is
// replaced so the tests do not depend on what else runs beside them.
ThreadTunerOptions idle_machine() {
  ThreadTunerOptions o;
  o.busy_cores = [] { return 0; };
  return o;
}

// Feeds the tuner the seconds per sample each count "takes" and returns the counts it ran.
std::vector<int> drive(ThreadTuner& tuner, int windows, const std::function<double(int)>& cost) {
  std::vector<int> ran;
  for (int w = 0; w < windows; ++w) {
    const int t = tuner.next();
    ran.push_back(t);
    tuner.record(cost(t));
  }
  return ran;
}

TEST(ThreadTuner, PicksTheFasterCountAndHoldsIt) {
  ThreadTunerOptions o = idle_machine();
  o.first_hold = 10;
  o.max_hold = 40;
  ThreadTuner tuner({1, 2}, o);
  const auto cost = [](int t) { return t == 2 ? 0.6 : 1.0; };
  // The run's first window is not timed; then 5 timed windows on each count, fewest first.
  const auto first = drive(tuner, 11, cost);
  EXPECT_EQ(std::count(first.begin(), first.end(), 1), 6);
  EXPECT_EQ(tuner.chosen(), 2);
  EXPECT_EQ(tuner.checks(), 1);
  // While the choice stands the interval doubles (10, 20, 40, 40, ... windows); each re-check
  // reuses the last windows on two threads and stops one thread after two windows 1.67x behind.
  const auto ran = drive(tuner, 200, cost);
  EXPECT_EQ(tuner.chosen(), 2);
  EXPECT_EQ(tuner.switches(), 0);
  EXPECT_GE(tuner.checks(), 5);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), 1), 2 * (tuner.checks() - 1));
}

TEST(ThreadTuner, PrefersFewerThreadsOnATie) {
  ThreadTuner tuner({1, 2, 4}, idle_machine());
  drive(tuner, 16, [](int t) { return t == 1 ? 1.0 : 0.99; });
  EXPECT_EQ(tuner.checks(), 1);
  EXPECT_EQ(tuner.chosen(), 1);
}

TEST(ThreadTuner, LeavesACountThatSlowsDownAndComesBackWhenTheLoadGoes) {
  ThreadTunerOptions o = idle_machine();
  o.first_hold = 20;
  o.max_hold = 80;
  ThreadTuner tuner({1, 2}, o);
  bool busy = false;  // another process on the second core: two threads take 5x longer
  const auto cost = [&](int t) { return t == 2 ? (busy ? 3.0 : 0.6) : 1.0; };
  drive(tuner, 25, cost);  // the first round (11 windows) and 14 of the 20 held
  ASSERT_EQ(tuner.chosen(), 2);
  busy = true;
  // Three slow windows make the median of the last five slow; the check that follows reuses
  // them and moves to one thread.
  const auto ran = drive(tuner, 15, cost);
  EXPECT_EQ(tuner.chosen(), 1);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), 2), 3) << "slow windows before leaving";
  drive(tuner, 300, cost);
  EXPECT_EQ(tuner.chosen(), 1);
  busy = false;
  drive(tuner, 200, cost);  // within one interval (at most 80 windows) plus a probe
  EXPECT_EQ(tuner.chosen(), 2);
  EXPECT_GE(tuner.switches(), 2);
}

// A slowdown that leaves the choice standing (the whole machine slowed) brings the next check
// after first_hold windows: the interval starts again instead of doubling.
TEST(ThreadTuner, AfterASlowdownTheIntervalStartsAgain) {
  ThreadTunerOptions o = idle_machine();
  o.first_hold = 10;
  o.max_hold = 1000;
  ThreadTuner tuner({1, 2}, o);
  drive(tuner, 11, [](int t) { return t == 2 ? 0.6 : 1.0; });
  ASSERT_EQ(tuner.chosen(), 2);
  ASSERT_EQ(tuner.checks(), 1);
  const auto slow = [](int t) { return t == 2 ? 1.2 : 2.0; };  // both twice as slow
  // Five slow windows (the median of five past 1.5x), then two on one thread: still slower.
  drive(tuner, 7, slow);
  ASSERT_EQ(tuner.checks(), 2);
  ASSERT_EQ(tuner.chosen(), 2);
  int windows = 0;
  while (tuner.checks() == 2 && windows < 100) {
    drive(tuner, 1, slow);
    ++windows;
  }
  EXPECT_EQ(windows, 10 + 2) << "first_hold windows held, then two on one thread";
}

// On a busy machine a check of the slow count costs one window.
TEST(ThreadTuner, UnderLoadACheckOfTheSlowCountStopsAfterOneWindow) {
  ThreadTunerOptions o = idle_machine();
  o.first_hold = 10;
  ThreadTuner tuner({1, 2}, o);
  const auto cost = [](int t) { return t == 2 ? 5.0 : 1.0; };
  const auto first = drive(tuner, 7, cost);  // 1 untimed + 5 timed on one thread, 1 on two
  EXPECT_EQ(std::count(first.begin(), first.end(), 2), 1);
  EXPECT_EQ(tuner.chosen(), 1);
  EXPECT_EQ(tuner.next(), 1);
  const auto ran = drive(tuner, 13, cost);  // 10 windows held, then the re-check
  EXPECT_EQ(tuner.checks(), 2);
  EXPECT_EQ(tuner.chosen(), 1);
  EXPECT_EQ(std::count(ran.begin(), ran.end(), 2), 1);
}

// One window 2.5x slow (an interrupt, a page fault) does not cut a probe short.
TEST(ThreadTuner, OneNoisyWindowDoesNotCutAProbeShort) {
  ThreadTuner tuner({1, 2}, idle_machine());
  int window = 0;
  drive(tuner, 11, [&](int t) {
    ++window;  // windows 1-6 on one thread, 7 is the first on two
    return t == 2 ? (window == 7 ? 2.5 : 0.6) : 1.0;
  });
  EXPECT_EQ(tuner.checks(), 1);
  EXPECT_EQ(tuner.chosen(), 2);
}

// A small difference does not move the choice away from the count in use.
TEST(ThreadTuner, ASmallDifferenceDoesNotFlipTheChoice) {
  ThreadTunerOptions o = idle_machine();
  o.first_hold = 10;
  ThreadTuner tuner({1, 2}, o);
  drive(tuner, 11, [](int t) { return t == 2 ? 0.6 : 1.0; });
  ASSERT_EQ(tuner.chosen(), 2);
  drive(tuner, 200, [](int t) { return t == 2 ? 0.6 : 0.59; });  // one thread now 2% faster
  EXPECT_EQ(tuner.chosen(), 2);
  EXPECT_EQ(tuner.switches(), 0);
  EXPECT_GE(tuner.checks(), 4);
}

// Another process busy on one of two cores: two threads are not even tried until it is gone.
TEST(ThreadTuner, DoesNotProbeCountsTheOtherProcessesLeaveNoRoomFor) {
  ThreadTunerOptions o = idle_machine();
  o.first_hold = 10;
  int busy = 1;
  o.busy_cores = [&] { return busy; };
  ThreadTuner tuner({1, 2}, o);
  const auto cost = [](int t) { return t == 2 ? 0.6 : 1.0; };
  const auto loaded = drive(tuner, 40, cost);
  EXPECT_EQ(std::count(loaded.begin(), loaded.end(), 2), 0);
  EXPECT_EQ(tuner.chosen(), 1);
  busy = 0;
  drive(tuner, 60, cost);  // the next check has room for two threads again
  EXPECT_EQ(tuner.chosen(), 2);
}

TEST(ThreadTuner, BusyCoresReadsThisMachine) {
  const int busy = busy_cores();  // this test's own threads are not counted
  EXPECT_GE(busy, 0);
  EXPECT_LE(busy, 4096);
}

TEST(ThreadTuner, RejectsBadSettings) {
  EXPECT_THROW(ThreadTuner({}), ValueError);
  EXPECT_THROW(ThreadTuner({2, 1}), ValueError);
  EXPECT_THROW(ThreadTuner({0, 1}), ValueError);
  ThreadTunerOptions o = idle_machine();
  o.slowdown = 1.0;
  EXPECT_THROW(ThreadTuner({1, 2}, o), ValueError);
  o = ThreadTunerOptions{};
  o.hopeless = 1.2;  // below slowdown
  EXPECT_THROW(ThreadTuner({1, 2}, o), ValueError);
  EXPECT_THROW(set_cpu_threads(0), ValueError);
  EXPECT_EQ(ThreadTuner::default_candidates(1), std::vector<int>({1}));
  EXPECT_EQ(ThreadTuner::default_candidates(2), std::vector<int>({1, 2}));
  EXPECT_EQ(ThreadTuner::default_candidates(12), std::vector<int>({1, 2, 4, 8, 12}));
}

}  // namespace
}  // namespace accrue
