// Data parallel across processes: CTest runs this under `mpiexec -n 2` (tests/CMakeLists.txt),
// so every test runs on both ranks, in the same order, and the collectives meet. The
// collectives against values worked out by hand; training on 2 ranks x micro 32 x k 2 against
// one process with micro 32 x k 4, the same windows, including a short last window shared
// unevenly (1001 samples: 7 windows of 128, then 105 = 53 + 52); the parameters bitwise equal
// on every rank.
#include <gtest/gtest.h>

#include <signal.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist_util.h"
#include "distributed/communicator.h"
#include "distributed/ops.h"
#include "distributed/pipeline.h"
#include "distributed/stage_ops.h"
#include "g2p.h"
#include "g2p_fixture.h"
#include "mnist_fixture.h"
#include "nn/mlp.h"
#include "optim/safetensors.h"
#include "test_util.h"
#include "toy_task.h"
#include "train/signals.h"

namespace accrue {
namespace {

using testing::Recorded;
using testing::train_recorded;

using testing::checkpoint_and_resume;
using testing::comm;
using testing::expect_same_on_every_rank;
using testing::shared_g2p_fixture;

TEST(Dist, TheLauncherStartedTwoRanks) {
  ASSERT_EQ(comm().world_size(), 2) << "run under mpiexec -n 2";
  EXPECT_STREQ(comm().backend(), "mpi");
  EXPECT_EQ(distributed::launch_info().rank, comm().rank());
}

TEST(Dist, CollectivesOnCpuTensors) {
  const int r = comm().rank();
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    // all_reduce_sum: rank r holds {r + 1, 10 (r + 1)} -> {3, 30}
    Tensor t = to_dtype(Tensor::from_vector<double>({2}, {r + 1.0, 10.0 * (r + 1)}), dtype);
    comm().all_reduce_sum(t);
    EXPECT_EQ(to_dtype(t, DType::kFloat64).to_vector<double>(), (std::vector<double>{3, 30}))
        << dtype_name(dtype);
    // broadcast from rank 1
    Tensor b = to_dtype(Tensor::from_vector<double>({3}, {double(r), 7, double(-r)}), dtype);
    comm().broadcast(b, 1);
    EXPECT_EQ(to_dtype(b, DType::kFloat64).to_vector<double>(), (std::vector<double>{1, 7, -1}));
    // all_gather: [2] per rank -> [4] in rank order
    const Tensor mine = to_dtype(Tensor::from_vector<double>({2}, {10.0 * r, 10.0 * r + 1}), dtype);
    Tensor all = Tensor::zeros({4}, dtype);
    comm().all_gather(mine, all);
    EXPECT_EQ(to_dtype(all, DType::kFloat64).to_vector<double>(),
              (std::vector<double>{0, 1, 10, 11}));
    // started ahead (ZeRO-3's prefetch), two at once, completed out of order
    Tensor ahead = Tensor::zeros({4}, dtype), second = Tensor::zeros({4}, dtype);
    auto first_gather = comm().start_all_gather(mine, ahead);
    auto second_gather = comm().start_all_gather(mine, second);
    second_gather->wait();
    first_gather->wait();
    EXPECT_TRUE(first_gather->done());
    EXPECT_EQ(to_dtype(ahead, DType::kFloat64).to_vector<double>(),
              (std::vector<double>{0, 1, 10, 11}));
    EXPECT_EQ(to_dtype(second, DType::kFloat64).to_vector<double>(),
              (std::vector<double>{0, 1, 10, 11}));
    // reduce_scatter: [4] per rank, summed, rank r keeps elements [2r, 2r + 2)
    const Tensor whole = to_dtype(Tensor::from_vector<double>({4}, {1, 2, 3, 4}), dtype);
    Tensor part = Tensor::zeros({2}, dtype);
    comm().reduce_scatter(whole, part);
    EXPECT_EQ(to_dtype(part, DType::kFloat64).to_vector<double>(),
              r == 0 ? (std::vector<double>{2, 4}) : (std::vector<double>{6, 8}));
    // in place (ZeRO-2's boundary policy): the result lands in this rank's own slice
    Tensor arena = to_dtype(Tensor::from_vector<double>({4}, {1, 2, 3, 4}), dtype);
    Tensor own = arena.narrow(2 * r, 2);
    comm().reduce_scatter(arena, own);
    EXPECT_EQ(to_dtype(own, DType::kFloat64).to_vector<double>(),
              r == 0 ? (std::vector<double>{2, 4}) : (std::vector<double>{6, 8}));
  }
  comm().barrier();
}

// The NCCL communicator on CUDA tensors: one GPU per rank, so it needs as many GPUs as ranks.
TEST(Dist, NcclCollectivesOnCudaTensors) {
  const int gpus = cuda_device_count();
  if (gpus < comm().world_size()) {
    GTEST_SKIP() << "NCCL needs one GPU per rank: " << comm().world_size() << " ranks, " << gpus
                 << " GPUs"
                 << (cuda_unavailable_reason().empty() ? ""
                                                       : " (" + cuda_unavailable_reason() + ")");
  }
  const Device gpu = Device::cuda(distributed::launch_info().local_rank);
  distributed::Communicator& nccl = distributed::world_for(gpu);
  EXPECT_STREQ(nccl.backend(), "nccl");
  const int r = comm().rank();
  Tensor t = Tensor::from_vector<double>({2}, {r + 1.0, 10.0 * (r + 1)}).to(gpu);
  nccl.all_reduce_sum(t);
  EXPECT_EQ(t.to(Device::cpu()).to_vector<double>(), (std::vector<double>{3, 30}));
  Tensor all = Tensor::zeros({4}, DType::kFloat32, gpu);
  nccl.all_gather(Tensor::from_vector<float>({2}, {10.0f * r, 10.0f * r + 1}).to(gpu), all);
  EXPECT_EQ(all.to(Device::cpu()).to_vector<float>(), (std::vector<float>{0, 1, 10, 11}));
  // Started ahead on the side stream, in 16 bits (ZeRO-3's working copy), then read on the main
  // stream after wait().
  Tensor ahead = Tensor::zeros({4}, DType::kBFloat16, gpu);
  auto gathering = nccl.start_all_gather(
      to_dtype(Tensor::from_vector<float>({2}, {10.0f * r, 10.0f * r + 1}), DType::kBFloat16)
          .to(gpu),
      ahead);
  gathering->wait();
  EXPECT_EQ(to_dtype(ahead, DType::kFloat32).to(Device::cpu()).to_vector<float>(),
            (std::vector<float>{0, 1, 10, 11}));
  nccl.settle();
  EXPECT_TRUE(gathering->done());
  Tensor part = Tensor::zeros({2}, DType::kFloat32, gpu);
  nccl.reduce_scatter(Tensor::from_vector<float>({4}, {1, 2, 3, 4}).to(gpu), part);
  EXPECT_EQ(part.to(Device::cpu()).to_vector<float>(),
            r == 0 ? (std::vector<float>{2, 4}) : (std::vector<float>{6, 8}));
  Tensor started = full({3}, 1.0, DType::kFloat32, gpu);
  nccl.start_all_reduce_sum(started);
  nccl.wait_all();
  EXPECT_EQ(started.to(Device::cpu()).to_vector<float>(), (std::vector<float>(3, 2.0f)));
  // Point-to-point both ways (staged through the host), and a split into two worlds of one.
  Tensor out = full({5}, 10.0 + r, DType::kFloat32, gpu),
         in = Tensor::zeros({5}, DType::kFloat32, gpu);
  auto sent = nccl.isend(out, 1 - r, 3);
  auto received = nccl.irecv(in, 1 - r, 3);
  sent->wait();
  received->wait();
  EXPECT_EQ(in.to(Device::cpu()).to_vector<float>(), (std::vector<float>(5, 11.0f - r)));
  const auto alone = nccl.split(r, 0);
  EXPECT_EQ(alone->world_size(), 1);
  Tensor own = full({2}, 1.0 + r, DType::kFloat32, gpu);
  alone->all_reduce_sum(own);
  EXPECT_EQ(own.to(Device::cpu()).to_vector<float>(), (std::vector<float>(2, 1.0f + r)));
  nccl.barrier();
}

// Two ranks on one GPU: NCCL would refuse them with "invalid usage"; every rank names the pair
// first. Runs where the ranks, all on one node, outnumber its GPUs, as on a one-GPU machine (the
// decision is the job's, so no rank is left in the collective setup alone).
TEST(Dist, RanksSharingOneGpuAreNamedBeforeNcclStarts) {
  const int gpus = cuda_device_count();
  Tensor elsewhere = Tensor::from_vector<double>(
      {1}, {distributed::launch_info().local_rank != comm().rank() ? 1.0 : 0.0});
  comm().all_reduce_sum(elsewhere);
  if (gpus == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
  if (elsewhere.to_vector<double>()[0] > 0) GTEST_SKIP() << "the ranks are on several nodes";
  if (gpus >= comm().world_size()) GTEST_SKIP() << "every rank has a GPU of its own";
  try {
    distributed::world_for(Device::cuda(0));
    ADD_FAILURE() << "two ranks on cuda:0 were accepted";
  } catch (const BackendError& e) {
    // NCCL's own refusal fails here; only a build without NCCL skips.
    if (std::string(e.what()).find("built without NCCL") == std::string::npos) throw;
    GTEST_SKIP() << e.what();
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 0 and 1 would share one GPU"), std::string::npos)
        << e.what();
  }
}

// isend / irecv between the two ranks, in every dtype (16-bit ones as their bits), both
// directions at once, messages with one tag in the order sent; the peer and tag checked.
TEST(Dist, PointToPointTransfersInEveryDtype) {
  const int r = comm().rank(), peer = 1 - r;
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64,
                      DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor first = to_dtype(full({2, 3}, 1.0 + r, DType::kFloat64), dtype);
    const Tensor second = to_dtype(full({4}, 5.0 + r, DType::kFloat64), dtype);
    Tensor got_first = Tensor::zeros({2, 3}, dtype), got_second = Tensor::zeros({4}, dtype);
    auto a = comm().isend(first, peer, 7);
    auto b = comm().isend(second, peer, 7);
    auto c = comm().irecv(got_first, peer, 7);
    auto d = comm().irecv(got_second, peer, 7);
    for (auto* t : {&a, &b, &c, &d}) (*t)->wait();
    EXPECT_TRUE(c->done());
    EXPECT_EQ(testing::as_doubles(got_first), std::vector<double>(6, 1.0 + peer));
    EXPECT_EQ(testing::as_doubles(got_second), std::vector<double>(4, 5.0 + peer));
  }
  Tensor t = Tensor::zeros({2});
  testing::expect_error<ValueError>([&] { comm().isend(t, r, 0); },
                                    {"[isend]", "peer rank " + std::to_string(r), "other than"});
  testing::expect_error<ValueError>([&] { comm().irecv(t, 2, 0); }, {"[irecv]", "peer rank 2"});
  testing::expect_error<ValueError>([&] { comm().isend(t, peer, -1); }, {"[isend]", "tag -1"});
  testing::expect_error<ValueError>([] { distributed::activation_tag(20000); },
                                    {"[pipeline]", "micro-batch 20000"});
  comm().barrier();
}

// split: by rank, two worlds of one; by one color with keys reversed, the two ranks swapped;
// collectives on a group stay in the group.
TEST(Dist, SplitMakesGroupsOfTheRanks) {
  const int r = comm().rank();
  const auto alone = comm().split(r, 0);
  EXPECT_EQ(alone->world_size(), 1);
  EXPECT_EQ(alone->rank(), 0);
  Tensor t = full({2}, 1.0 + r, DType::kFloat64);
  alone->all_reduce_sum(t);
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>(2, 1.0 + r)));
  const auto swapped = comm().split(0, -r);
  EXPECT_EQ(swapped->world_size(), 2);
  EXPECT_EQ(swapped->rank(), 1 - r);
  Tensor mine = full({1}, double(r), DType::kFloat64), both = Tensor::zeros({2}, DType::kFloat64);
  swapped->all_gather(mine, both);
  EXPECT_EQ(both.to_vector<double>(), (std::vector<double>{1, 0}));  // in the group's order
  testing::expect_error<ValueError>([&] { comm().split(-1, 0); }, {"[split]", "color -1"});
  comm().barrier();
}

TEST(Dist, BadCollectiveArgumentsNameTheOpAndTheTensors) {
  Tensor small = Tensor::zeros({3}), wrong = Tensor::zeros({5});
  try {
    comm().all_gather(small, wrong);
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[5]"), std::string::npos) << e.what();
  }
  Tensor f64 = Tensor::zeros({6}, DType::kFloat64);
  EXPECT_THROW(comm().reduce_scatter(f64, small), DTypeError);
  EXPECT_THROW(comm().broadcast(small, 2), ValueError);
  // Aliasing: all_gather in place from this rank's own slice works; any other overlap throws.
  Tensor whole = Tensor::from_vector<float>({4}, {0, 0, 0, 0});
  Tensor own = whole.narrow(2 * comm().rank(), 2);
  fill_(own, float(comm().rank() + 1));
  comm().all_gather(own, whole);
  EXPECT_EQ(whole.to_vector<float>(), (std::vector<float>{1, 1, 2, 2}));
  Tensor other = whole.narrow(2 * (1 - comm().rank()), 2);
  EXPECT_THROW(comm().all_gather(other, whole), ValueError);
  // reduce_scatter in place into this rank's own slice works (ZeRO-2); into another's throws.
  EXPECT_THROW(comm().reduce_scatter(whole, other), ValueError);
}

// The gradient of L = sum over ranks of L_r against central differences in float64, where
// L_r = sum(tanh(collective(x)) * w_r) with rank-dependent x and w. Each probe perturbs one
// element on one rank; every rank recomputes its L_r and the sum is all-reduced, so every rank
// takes part in every probe.
double collective_gradcheck(const std::function<Tensor(const Tensor&)>& collective,
                            const Shape& in_shape, const Shape& out_shape) {
  const int r = comm().rank();
  Tensor x = testing::random(in_shape, 100 + r);
  const Tensor w = testing::random(out_shape, 200 + r);
  const auto total_loss = [&](const Tensor& input) {
    NoGradGuard no_grad;
    Tensor l = full({1}, sum(mul(accrue::tanh(collective(input)), w)).item(), DType::kFloat64);
    comm().all_reduce_sum(l);
    return l.item();
  };
  x.set_requires_grad(true);
  backward(sum(mul(accrue::tanh(collective(x)), w)));
  const std::vector<double> analytic = x.grad().to_vector<double>();
  double worst = 0;
  const double eps = 1e-6;
  for (int owner = 0; owner < comm().world_size(); ++owner) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      Tensor probe = x.clone();
      double* p = probe.data<double>();
      if (r == owner) p[i] += eps;
      const double up = total_loss(probe);
      if (r == owner) p[i] -= 2 * eps;
      const double down = total_loss(probe);
      const double numeric = (up - down) / (2 * eps);
      if (r == owner) {
        worst = std::max(
            worst, std::abs(numeric - analytic[size_t(i)]) / std::max(1.0, std::abs(numeric)));
      }
    }
  }
  return worst;
}

TEST(Dist, AllGatherIsDifferentiableAcrossRanks) {
  const double worst = collective_gradcheck(
      [](const Tensor& x) { return distributed::all_gather(x, comm()); }, {3, 2}, {6, 2});
  EXPECT_LT(worst, 1e-8);
}

TEST(Dist, AllReduceSumIsDifferentiableAcrossRanks) {
  const double worst = collective_gradcheck(
      [](const Tensor& x) { return distributed::all_reduce_sum(x, comm()); }, {2, 3}, {2, 3});
  EXPECT_LT(worst, 1e-8);
}

// The stage boundary's gradient across ranks against central differences in float64: rank 0
// computes y = tanh(x * w0) and sends it; rank 1 receives it and computes
// L = sum(tanh(y) * w1), so dL/dx on rank 0 crosses the ranks through the recorded ops.
TEST(Dist, SendAndReceiveActivationsAreDifferentiableAcrossRanks) {
  const int r = comm().rank();
  Tensor x = testing::random({3, 4}, 300);
  const Tensor w0 = testing::random({3, 4}, 301), w1 = testing::random({3, 4}, 302);
  // Both ranks take part in every evaluation; rank 1's loss is broadcast.
  const auto loss_of = [&](const Tensor& input) {
    Tensor l = Tensor::zeros({1}, DType::kFloat64);
    if (r == 0) {
      distributed::send_activation(accrue::tanh(mul(input, w0)), 1, 0, comm());
    } else {
      const Tensor y = distributed::recv_activation(0, 0, DType::kFloat64, Device::cpu(), comm());
      l = full({1}, sum(mul(accrue::tanh(y), w1)).item(), DType::kFloat64);
    }
    comm().broadcast(l, 1);
    return l.item();
  };
  // An activation in another dtype than the receiving stage expects is refused by name; the
  // data message is drained so no later receive meets it.
  const int odd = 5000;
  if (r == 0) {
    distributed::send_activation(full({2, 3}, 1.0, DType::kFloat32), 1, odd, comm());
  } else {
    testing::expect_error<DTypeError>(
        [&] { distributed::recv_activation(0, odd, DType::kFloat64, Device::cpu(), comm()); },
        {"[recv_activation]", "rank 0", "micro-batch 5000", "float32", "expects float64"});
    Tensor drained = Tensor::empty({2, 3}, DType::kFloat32);
    comm().irecv(drained, 0, distributed::activation_tag(odd))->wait();
  }
  x.set_requires_grad(true);
  if (r == 0) {
    const Tensor token = distributed::send_activation(accrue::tanh(mul(x, w0)), 1, 0, comm());
    ASSERT_TRUE(token.requires_grad());
    backward(token);
  } else {
    const Tensor y = distributed::recv_activation(0, 0, DType::kFloat64, Device::cpu(), comm());
    EXPECT_EQ(y.shape(), (Shape{3, 4}));
    backward(sum(mul(accrue::tanh(y), w1)));
  }
  EXPECT_EQ(tape_size(), 0u);
  double worst = 0;
  const double eps = 1e-6;
  NoGradGuard no_grad;
  for (int64_t i = 0; i < x.numel(); ++i) {
    Tensor probe = x.clone();
    probe.data<double>()[i] += eps;
    const double up = loss_of(probe);
    probe.data<double>()[i] -= 2 * eps;
    const double down = loss_of(probe);
    const double numeric = (up - down) / (2 * eps);
    if (r == 0) {
      const double analytic = x.grad().to_vector<double>()[size_t(i)];
      worst = std::max(worst, std::abs(numeric - analytic) / std::max(1.0, std::abs(numeric)));
    }
  }
  EXPECT_LT(worst, 1e-8);
}

// The MLP cut into two stages on the two ranks (Linear + ReLU | Linear + ReLU + Linear + loss),
// a window of k micro-batches under GPipe and 1F1B, and a short window of one micro-batch
// (fewer than the stages): each stage's gradients equal one process's accumulation of the same
// window in float64, every tape is empty and every activation freed afterwards, and 1F1B holds
// at most P - s micro-batches in flight while GPipe holds k.
TEST(Dist, TwoPipelineStagesEqualOneProcessInFloat64) {
  const int r = comm().rank();
  nn::manual_seed(21);
  nn::MLP model({6, 12, 10, 3}, nn::activation<nn::ReLU>(), DType::kFloat64);
  const auto& layers = model.layers();
  const auto stage_forward = [&](int stage, const Tensor& x) {
    if (stage == 0) return layers[0]->forward_relu(x);
    return (*layers[2])(layers[1]->forward_relu(x));
  };
  std::vector<Tensor> own;  // this stage's parameters
  for (int i : r == 0 ? std::vector<int>{0} : std::vector<int>{1, 2}) {
    for (const Tensor& p : layers[size_t(i)]->parameters()) own.push_back(p);
  }
  for (const int k : {6, 1}) {
    std::vector<Tensor> inputs, labels;
    int64_t items = 0;
    for (int m = 0; m < k; ++m) {
      const int64_t rows = 3 + m % 2;
      inputs.push_back(testing::random({rows, 6}, 400 + m));
      std::vector<int32_t> y;
      for (int64_t i = 0; i < rows; ++i) y.push_back(int32_t((m + 2 * i) % 3));
      labels.push_back(Tensor::from_vector<int32_t>({rows}, y));
      items += rows;
    }
    const double seed = 1.0 / double(items);
    std::vector<Tensor> expected;
    for (int m = 0; m < k; ++m) {
      backward(cross_entropy(stage_forward(1, stage_forward(0, inputs[m])), labels[m]), seed);
    }
    for (Tensor& p : own) expected.push_back(p.grad().clone());
    for (Tensor& p : model.parameters()) p.grad().zero_();
    distributed::PipelineStage stage(comm(), DType::kFloat64, Device::cpu());
    distributed::PipelineStage::Functions f;
    f.input = [&](int m) { return inputs[m]; };
    f.forward = [&](const Tensor& x, int) { return stage_forward(r, x); };
    f.loss = [&](const Tensor& y, int m) { return cross_entropy(y, labels[m]); };
    for (const auto schedule :
         {distributed::PipelineSchedule::kGPipe, distributed::PipelineSchedule::kOneFOneB}) {
      SCOPED_TRACE(std::string(distributed::schedule_name(schedule)) + " k " + std::to_string(k));
      const size_t before = allocator_for(Device::cpu()).stats().live_bytes;
      const auto stats = stage.run_schedule(schedule, k, full({}, seed, DType::kFloat64), f);
      EXPECT_EQ(tape_size(), 0u);
      EXPECT_EQ(allocator_for(Device::cpu()).stats().live_bytes, before);
      EXPECT_EQ(stats.max_in_flight,
                schedule == distributed::PipelineSchedule::kGPipe ? k : std::min(2 - r, k));
      for (size_t i = 0; i < own.size(); ++i) {
        EXPECT_LT(testing::max_rel_error(own[i].grad(), expected[i]), 1e-10) << i;
        own[i].grad().zero_();
      }
    }
  }
  comm().barrier();
}

mnist::Config dp_config(const std::filesystem::path& data, const std::string& precision) {
  mnist::Config c;
  c.data = data.string();
  c.hidden = {48, 24};
  c.quiet = true;
  c.seed = 5;
  c.epochs = 2;
  c.threads = 1;
  c.precision = train::parse_precision(precision);
  c.micro_batch = 32;
  return c;
}

// The engine with --pipeline 2 on the two ranks, float64: the MLP's layers.0 on stage 0 and
// layers.1, layers.2 on stage 1, under GPipe and 1F1B, against one process with the same
// micro-batch and k -- per-step loss and norm and the final weights within 1e-10. 916 samples
// at 32 x 4 leave a last window of 20 samples: one micro-batch, fewer than the stages.
TEST(Dist, PipelinedEngineEqualsOneProcessInFloat64) {
  const auto data = testing::make_dataset("dist-pipeline", 916, 64);
  mnist::Config c = dp_config(data, "fp64");
  c.seed = 9;
  c.accum_steps = 4;
  const auto single = distributed::make_single_process();
  mnist::Config one = c;
  one.comm = single.get();
  one.save = (data / "one.safetensors").string();
  const Recorded reference = train_recorded(one, std::cout);
  size_t first_stage_peak[2] = {0, 0};
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(schedule);
    mnist::Config p = c;
    p.pipeline = 2;
    p.pipeline_schedule = distributed::parse_pipeline_schedule(schedule);
    p.save = (data / ("pipeline-" + schedule + ".safetensors")).string();
    const Recorded r = train_recorded(p, std::cout);
    EXPECT_EQ(tape_size(), 0u);
    // Both stages are data-parallel rank 0; one process of the job prints.
    EXPECT_EQ(r.prints, comm().rank() == 0);
    testing::expect_same_steps(r, reference, 1e-10);
    EXPECT_EQ(r.step_batches.back(), 20);
    EXPECT_EQ(r.test_accuracy, reference.test_accuracy);
    ASSERT_EQ(r.stages.size(), 2u);
    EXPECT_EQ(r.stages[0].max_in_flight, schedule == "gpipe" ? 4 : 2);
    EXPECT_EQ(r.stages[1].max_in_flight, schedule == "gpipe" ? 4 : 1);
    first_stage_peak[schedule == "gpipe" ? 0 : 1] = r.stages[0].peak_activation_bytes;
    if (comm().rank() == 0) testing::expect_same_weights(p.save, one.save, 1e-10);
  }
  // 1F1B holds two micro-batches' activations on the first stage, GPipe four.
  EXPECT_LT(first_stage_peak[1], first_stage_peak[0]);
  comm().barrier();
}

// 16-bit precisions through the stages: each stage's working copy, the other stages' layers held
// in the compute dtype, 16-bit activations and gradients between the ranks. Without clipping
// (the stages' norm sums its partials in another order, so its last bits differ) the MLP's
// per-step losses, loss scales (fp16) and saved masters equal one process's bit for bit.
TEST(Dist, PipelineStagesTrainIn16BitsToOneProcesssWeights) {
  const auto data = testing::make_dataset("dist-pipeline-16", 916, 64);
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const std::string precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    mnist::Config c = dp_config(data, precision);
    c.accum_steps = 4;
    c.clip = 0;
    const auto single = distributed::make_single_process();
    mnist::Config one = c;
    one.comm = single.get();
    one.save = (data / ("one-" + precision + ".safetensors")).string();
    const Recorded reference = train_recorded(one, std::cout);
    c.pipeline = 2;
    c.save = (data / ("pipeline-" + precision + ".safetensors")).string();
    const Recorded r = train_recorded(c, std::cout);
    EXPECT_EQ(r.step_losses, reference.step_losses);
    EXPECT_EQ(r.step_loss_scales, reference.step_loss_scales);
    EXPECT_EQ(r.parameter_hash, reference.parameter_hash);  // the stages' masters, gathered
    if (comm().rank() == 0) {
      EXPECT_EQ(bytes(c.save), bytes(one.save));
    }
  }
  comm().barrier();
}

// {world summary, single-process summary, max relative difference of the final weights (rank 0)}
struct Compared {
  Recorded dp, single;
  double weights = 0;
};
Compared train_both(const std::string& precision, const std::string& name) {
  const auto data = testing::make_dataset("dist-" + name, 1001, 64);
  Compared out;
  mnist::Config c = dp_config(data, precision);
  c.accum_steps = 2;
  c.save = (data / "dp.safetensors").string();  // written by rank 0
  out.dp = train_recorded(c, std::cout);
  const auto single = distributed::make_single_process();
  c.comm = single.get();
  c.accum_steps = 4;
  c.save = (data / "single.safetensors").string();
  out.single = train_recorded(c, std::cout);
  if (comm().rank() == 0) {
    const auto a = optim::read_safetensors((data / "dp.safetensors").string());
    const auto b = optim::read_safetensors((data / "single.safetensors").string());
    for (const auto& [key, t] : a)
      out.weights = std::max(out.weights, testing::max_rel_error(t, b.at(key)));
  }
  return out;
}

TEST(Dist, TwoRanksTimesKTwoEqualOneRankTimesKFourInFloat64) {
  const Compared r = train_both("fp64", "fp64");
  ASSERT_EQ(r.dp.step_losses.size(), 16u);  // 2 epochs x 8 windows, the last one short
  ASSERT_EQ(r.single.step_losses.size(), 16u);
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_NEAR(r.dp.step_losses[i], r.single.step_losses[i], 1e-12 * r.single.step_losses[i])
        << "step " << i + 1;
    EXPECT_NEAR(r.dp.step_grad_norms[i], r.single.step_grad_norms[i],
                1e-12 * r.single.step_grad_norms[i])
        << "step " << i + 1;
  }
  if (comm().rank() == 0) {
    EXPECT_LT(r.weights, 1e-12);
  }
}

TEST(Dist, TwoRanksTimesKTwoEqualOneRankTimesKFourInFloat32) {
  const Compared r = train_both("fp32", "fp32");
  ASSERT_EQ(r.dp.step_losses.size(), r.single.step_losses.size());
  for (size_t i = 0; i < 8; ++i) {  // the first epoch
    EXPECT_NEAR(r.dp.step_losses[i], r.single.step_losses[i], 1e-5 * r.single.step_losses[i])
        << "step " << i + 1;
    EXPECT_NEAR(r.dp.step_grad_norms[i], r.single.step_grad_norms[i],
                1e-5 * r.single.step_grad_norms[i])
        << "step " << i + 1;
  }
}

// After training, every rank holds the same parameters to the bit.
TEST(Dist, ParametersAreBitwiseEqualOnEveryRank) {
  const auto data = testing::make_dataset("dist-hash", 1001, 64);
  mnist::Config c = dp_config(data, "fp32");
  c.accum_steps = 2;
  const Recorded s = train_recorded(c, std::cout);
  expect_same_on_every_rank(s.parameter_hash);
}

// The all-reduce overlapped with the last backward, in buckets, gives the weights of the one
// all-reduce at the boundary to the bit; on 897 samples the last window has one sample, which
// rank 1 does not see: its buckets start at the boundary, in the same order.
TEST(Dist, OverlappedBucketsGiveTheSameWeightsBitwise) {
  for (int64_t samples : {1001, 897}) {
    const auto data = testing::make_dataset("dist-overlap-" + std::to_string(samples), samples, 64);
    mnist::Config c = dp_config(data, "fp32");
    c.accum_steps = 2;
    const Recorded one = train_recorded(c, std::cout);
    // 4 KiB buckets, last layer first: {fc2 bias, fc2 weight, fc1 bias, fc1 weight (4.5 KiB)},
    // then {fc0 bias, fc0 weight}: two buckets a window.
    c.bucket_kib = 4;
    const Recorded overlapped = train_recorded(c, std::cout);
    EXPECT_EQ(overlapped.parameter_hash, one.parameter_hash) << samples << " samples";
    EXPECT_EQ(overlapped.step_losses, one.step_losses);
    const int64_t windows = static_cast<int64_t>(one.step_losses.size());
    EXPECT_EQ(overlapped.buckets_overlapped + overlapped.buckets_at_step, 2 * windows);
    if (samples == 897 && comm().rank() == 1) {  // no sample in each epoch's last window
      EXPECT_EQ(overlapped.buckets_at_step, 2 * 2);
    } else {
      EXPECT_EQ(overlapped.buckets_at_step, 0) << "every bucket should start during backward";
    }
  }
}

// The offloaded optimizer across ranks: the all-reduce (at the boundary or overlapped in
// buckets) sums the device gradient, then it goes to the host; the same weights to the bit as the
// optimizer on the compute device, in float32 and in bfloat16.
TEST(Dist, OffloadedOptimizerTrainsTheSameWeightsBitwise) {
  const auto data = testing::make_dataset("dist-offload", 1001, 64);
  for (const char* precision : {"fp32", "bf16"}) {
    mnist::Config c = dp_config(data, precision);
    c.accum_steps = 2;
    const Recorded plain = train_recorded(c, std::cout);
    for (int64_t bucket_kib : {0, 4}) {
      c.offload_optimizer = true;
      c.bucket_kib = bucket_kib;
      const Recorded offloaded = train_recorded(c, std::cout);
      SCOPED_TRACE(str_cat(precision, ", buckets of ", bucket_kib, " KiB"));
      EXPECT_EQ(offloaded.parameter_hash, plain.parameter_hash);
      EXPECT_EQ(offloaded.step_losses, plain.step_losses);
      expect_same_on_every_rank(offloaded.parameter_hash);
      EXPECT_EQ(offloaded.offload.steps, static_cast<int64_t>(plain.step_losses.size()));
      EXPECT_EQ(offloaded.offload.prefetched, 0) << "the copy waits for the all-reduce";
      EXPECT_LT(offloaded.device_state_bytes, plain.device_state_bytes);
    }
  }
}

// ZeRO stage 1: the same training within float64 rounding, every rank's parameters bitwise
// equal, and half the optimizer state per rank.
TEST(Dist, ShardedOptimizerStateTrainsTheSameWithHalfTheMemory) {
  const auto data = testing::make_dataset("dist-zero", 1001, 64);
  mnist::Config c = dp_config(data, "fp64");
  c.accum_steps = 2;
  c.metrics = (data / "zero0.jsonl").string();
  const Recorded plain = train_recorded(c, std::cout);
  c.zero = 1;
  c.metrics = (data / "zero1.jsonl").string();
  const Recorded sharded = train_recorded(c, std::cout);
  ASSERT_EQ(plain.step_losses.size(), sharded.step_losses.size());
  for (size_t i = 0; i < plain.step_losses.size(); ++i) {
    EXPECT_NEAR(sharded.step_losses[i], plain.step_losses[i], 1e-12 * plain.step_losses[i]) << i;
    EXPECT_NEAR(sharded.step_grad_norms[i], plain.step_grad_norms[i],
                1e-12 * plain.step_grad_norms[i])
        << i;
  }
  expect_same_on_every_rank(sharded.parameter_hash);
  if (comm().rank() == 0) {  // the summary records the state each rank holds
    const auto state = [](const std::filesystem::path& metrics) {
      std::ifstream in(metrics);
      std::string line, last;
      while (std::getline(in, line)) last = line;
      return nlohmann::json::parse(last).at("optimizer_state_bytes").get<int64_t>();
    };
    const int64_t full = state(data / "zero0.jsonl"), half = state(data / "zero1.jsonl");
    EXPECT_GT(full, 0);
    EXPECT_LE(half, full / 2 + 64 * 8) << full;  // padding to equal shards: a few elements
  }
}

// Mixed precision across ranks: the gradient arena that is all-reduced (or reduce-scattered)
// is float32 whatever the activations are; under ZeRO each rank updates its slice of the masters
// and of the 16-bit working copy and gathers both; the loss scale moves on every rank alike
// (it reads the all-reduced non-finite count). Sharded or not, the same training, and every
// rank ends with the same bits.
TEST(Dist, MixedPrecisionShardedOrNotTrainsTheSame) {
  const auto data = testing::make_dataset("dist-mixed", 1001, 64);
  for (const char* precision : {"bf16", "fp16"}) {
    mnist::Config c = dp_config(data, precision);
    c.accum_steps = 2;
    const Recorded plain = train_recorded(c, std::cout);
    c.zero = 1;
    const Recorded sharded = train_recorded(c, std::cout);
    ASSERT_EQ(plain.step_losses.size(), sharded.step_losses.size());
    for (size_t i = 0; i < plain.step_losses.size(); ++i) {
      EXPECT_NEAR(sharded.step_losses[i], plain.step_losses[i], 1e-4 * plain.step_losses[i])
          << precision << " step " << i;
    }
    EXPECT_EQ(sharded.step_loss_scales, plain.step_loss_scales) << precision;
    expect_same_on_every_rank(plain.parameter_hash);
    expect_same_on_every_rank(sharded.parameter_hash);
  }
}

// A checkpoint written by --zero 1 across the ranks (each rank's slice of the optimizer state
// gathered into one file) resumes to the bits of an uninterrupted run.
TEST(Dist, ShardedRunsResumeBitForBit) {
  const auto data = testing::make_dataset("dist-resume", 1001, 64);
  mnist::Config c = dp_config(data, "fp32");
  c.accum_steps = 2;
  c.zero = 1;
  c.max_steps = 10;
  const Recorded whole = train_recorded(c, std::cout);
  const Recorded resumed =
      checkpoint_and_resume(c, std::filesystem::temp_directory_path() / "accrue-dist-resume");
  EXPECT_EQ(resumed.parameter_hash, whole.parameter_hash);
  expect_same_on_every_rank(resumed.parameter_hash);
}

// Plain data parallelism: rank 0 writes the checkpoints and every rank resumes from them. Ranks
// given different folders (an MPMD launch, or a copy on one node that went stale) would train
// diverged replicas from different steps: they are stopped, naming both steps.
TEST(Dist, RanksResumingFromDifferentStepsAreStopped) {
  const auto data = testing::make_dataset("dist-resume-folders", 1001, 64);
  mnist::Config c = dp_config(data, "fp32");
  c.accum_steps = 2;
  c.max_steps = 10;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "accrue-dist-resume-folders";
  const std::filesystem::path written = dir / "written", stale = dir / "stale";
  if (comm().rank() == 0) std::filesystem::remove_all(dir);
  comm().barrier();
  c.checkpoint = written.string();
  c.checkpoint_every = 5;
  train_recorded(c, std::cout);
  comm().barrier();
  if (comm().rank() == 0) {
    std::filesystem::copy(written, stale, std::filesystem::copy_options::recursive);
    for (const char* ext : {".json", ".safetensors"}) {
      ASSERT_TRUE(std::filesystem::remove(stale / (std::string("step-0000000010") + ext)));
    }
  }
  comm().barrier();
  c.checkpoint.clear();
  c.max_steps = 12;
  c.resume = (comm().rank() == 0 ? written : stale).string();
  testing::expect_error<FileError>(
      [&] { train_recorded(c, std::cout); },
      {"different steps", comm().rank() == 0 ? "rank 0: 10, rank 1: 5" : "rank 1: 5, rank 0: 10",
       "the same folder"});
  comm().barrier();
  // The same folder on every rank resumes.
  c.resume = written.string();
  EXPECT_NO_THROW(train_recorded(c, std::cout));
  comm().barrier();
}

// Pipeline stages checkpoint each their part (DIR/stage-<s>, written by the stage's own rank) and
// resume bit for bit; another --pipeline setting is refused by name.
TEST(Dist, PipelineStagesResumeBitForBit) {
  const auto data = testing::make_dataset("dist-pipeline-resume", 1001, 64);
  mnist::Config c = dp_config(data, "fp32");
  c.accum_steps = 4;
  c.pipeline = 2;
  c.max_steps = 10;
  const Recorded whole = train_recorded(c, std::cout);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "accrue-dist-pipeline-resume";
  const Recorded resumed = checkpoint_and_resume(c, dir, [&](mnist::Config& r) {
    EXPECT_TRUE(std::filesystem::exists(dir / "stage-0" / "step-0000000005.json"));
    EXPECT_TRUE(std::filesystem::exists(dir / "stage-1" / "step-0000000005.json"));
    r.pipeline_schedule = distributed::PipelineSchedule::kGPipe;  // the same sums in the same
                                                                  // order: allowed, and bitwise
  });
  EXPECT_EQ(resumed.parameter_hash, whole.parameter_hash);
  expect_same_on_every_rank(resumed.parameter_hash);
  // One process (a world of its own on each rank) cannot take the stages' checkpoints.
  const auto single = distributed::make_single_process();
  mnist::Config one = c;
  one.pipeline = 1;
  one.comm = single.get();
  testing::expect_error<FileError>([&] { train_recorded(one, std::cout); },
                                   {"--resume", "pipeline stages", "--pipeline 1"});
  comm().barrier();
}

// A SIGTERM on rank 1 alone (at step 3) stops both ranks after the same step: the vote rides the
// boundary's all-reduce. The checkpoint at step 4 resumes to the uninterrupted weights (#22).
TEST(Dist, ASignalOnOneRankStopsEveryRankAtTheSameStep) {
  const auto data = testing::make_dataset("dist-signal", 512, 64);
  mnist::Config c = dp_config(data, "fp32");
  c.accum_steps = 2;
  c.max_steps = 12;
  const Recorded whole = train_recorded(c, std::cout);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "accrue-dist-signal";
  if (comm().rank() == 0) std::filesystem::remove_all(dir);
  comm().barrier();
  c.checkpoint = dir.string();
  int64_t last_step = 0;
  train::Callbacks callbacks;
  callbacks.on_step = [&](const train::StepEvent& e) {
    last_step = e.step;
    if (e.step == 3 && comm().rank() == 1) ::raise(SIGTERM);
  };
  try {
    mnist::train(c, std::cout, callbacks);
    ADD_FAILURE() << "rank " << comm().rank() << " did not stop";
  } catch (const train::Stopped& e) {
    const std::string why = comm().rank() == 1 ? "stopped by SIGTERM" : "another rank's request";
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  EXPECT_EQ(last_step, 4);
  EXPECT_TRUE(std::filesystem::exists(dir / "step-0000000004.json"));
  c.resume = dir.string();
  const Recorded resumed = train_recorded(c, std::cout);
  EXPECT_EQ(resumed.parameter_hash, whole.parameter_hash);
  expect_same_on_every_rank(resumed.parameter_hash);
}

// BatchNorm's running statistics are rank 0's on every rank after each boundary (as PyTorch's DDP
// broadcasts them), though each rank's samples differ: evaluation and saving see one set (#22).
TEST(Dist, BatchNormBuffersAreRankZerosOnEveryRank) {
  const auto data = testing::make_dataset("dist-buffers", 256, 64);
  mnist::Config c = dp_config(data, "fp32");
  c.model = "cnn";
  c.norm = "batch";
  c.accum_steps = 2;
  c.max_steps = 3;
  const Recorded r = train_recorded(c, std::cout);
  EXPECT_NE(r.buffer_hash, 0u);
  expect_same_on_every_rank(r.buffer_hash);
  expect_same_on_every_rank(r.parameter_hash);
}

// The engine with token-counted items on 2 ranks: each rank's share of a window holds a different
// number of tokens, and the window is still normalised by the tokens of both; the same run on
// one rank (whose micro-batches are twice as large) gives the same steps and weights.
TEST(Dist, TheEngineOnTwoRanksNormalisesByTheTokensOfBoth) {
  using testing::run_toy;
  using testing::toy_config;
  std::unique_ptr<distributed::Communicator> single = distributed::make_single_process();
  train::Config one = toy_config(8, 2);
  one.comm = single.get();
  train::Config two = toy_config(4, 2);
  two.comm = &comm();
  const testing::ToyRun a = run_toy(one), b = run_toy(two);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(b.steps[i].items, a.steps[i].items) << i;
    EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, 1e-12 * a.steps[i].loss) << i;
    EXPECT_NEAR(b.steps[i].grad_norm, a.steps[i].grad_norm, 1e-12 * a.steps[i].grad_norm) << i;
  }
  EXPECT_GT(a.steps[0].items, a.steps[0].samples);
}

// A GPT of `layers` blocks, width 8 and 2 heads on the fixture in dir, one epoch, quiet, one
// thread, no warm-up.
g2p::Config small_g2p(const std::filesystem::path& dir, const std::string& precision, int layers) {
  g2p::Config c;
  c.data = (dir / "dict.txt").string();
  c.layers = layers, c.heads = 2, c.width = 8, c.quiet = true;
  c.precision = train::parse_precision(precision);
  c.epochs = 1, c.warmup = 0, c.threads = 1;
  return c;
}

// Trains accrue-g2p with `c`, saving to dir/<tag>.safetensors; its steps go to `steps`.
train::Summary train_g2p(g2p::Config c, const std::filesystem::path& dir, const std::string& tag,
                         std::vector<train::StepEvent>& steps) {
  c.save = (dir / (tag + ".safetensors")).string();
  train::Callbacks callbacks;
  callbacks.on_step = [&](const train::StepEvent& e) { steps.push_back(e); };
  std::ostringstream out;
  return g2p::train(c, out, callbacks);
}

// The G2P transformer cut into two stages (the embeddings and blocks on one, blocks, the final
// LayerNorm and the head tied to the token embedding on the other) trains in float64 under
// GPipe and 1F1B to one process's per-step loss, norm and weights: the head's copy of the tied
// matrix sends its gradient to the embedding's stage and gets the update back every step (were
// it stale, the second step's loss would already differ).
TEST(Dist, G2PPipelineStagesEqualOneProcessWithTheTiedMatrix) {
  const auto dir = shared_g2p_fixture(comm(), "accrue-g2p-pipeline");
  g2p::Config c = small_g2p(dir, "fp64", 2);
  c.epochs = 2, c.micro_batch = 16, c.accum_steps = 4;
  const auto run = [&](const std::string& tag, distributed::Communicator* comm, int pipeline,
                       const std::string& schedule, std::vector<train::StepEvent>& steps) {
    g2p::Config r = c;
    r.comm = comm, r.pipeline = pipeline,
    r.pipeline_schedule = distributed::parse_pipeline_schedule(schedule);
    return train_g2p(r, dir, tag, steps);
  };
  const auto single = distributed::make_single_process();
  std::vector<train::StepEvent> one_steps;
  const std::string one_name = "one-" + std::to_string(comm().rank());
  run(one_name, single.get(), 1, "1f1b", one_steps);
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(schedule);
    std::vector<train::StepEvent> steps;
    const train::Summary s = run("pipeline-" + schedule, nullptr, 2, schedule, steps);
    ASSERT_EQ(steps.size(), one_steps.size());
    ASSERT_GT(steps.size(), 2u);
    for (size_t i = 0; i < steps.size(); ++i) {
      EXPECT_NEAR(steps[i].loss, one_steps[i].loss, 1e-10 * one_steps[i].loss) << i;
      EXPECT_NEAR(steps[i].grad_norm, one_steps[i].grad_norm, 1e-10 * one_steps[i].grad_norm);
    }
    EXPECT_EQ(s.stages.size(), 2u);
    EXPECT_TRUE(s.tied_copies_identical);  // the head's copy and the embedding, bit for bit
    if (comm().rank() == 0) {
      testing::expect_same_weights((dir / ("pipeline-" + schedule + ".safetensors")).string(),
                                   (dir / (one_name + ".safetensors")).string(), 1e-10);
    }
  }
  comm().barrier();
}

// The G2P GPT in fp16 with dynamic loss scaling, cut into two stages: the tied matrix's
// gradient is summed in another order (the head's part and the embedding's apart), so the run is
// not bitwise one process's; the loss scale takes the same steps and the per-step losses stay
// within 1e-4 of one process's (measured on the real dictionary: 4.5e-6 after 30 steps).
TEST(Dist, G2PPipelineStagesTrainInFp16WithTheLossScale) {
  const auto dir = shared_g2p_fixture(comm(), "accrue-g2p-pipeline-fp16");
  g2p::Config c = small_g2p(dir, "fp16", 2);
  c.epochs = 2, c.micro_batch = 16, c.accum_steps = 4;
  const auto single = distributed::make_single_process();
  std::vector<train::StepEvent> one_steps, steps;
  g2p::Config one = c;
  one.comm = single.get();
  train_g2p(one, dir, "one-" + std::to_string(comm().rank()), one_steps);
  c.pipeline = 2;
  const train::Summary s = train_g2p(c, dir, "pipeline", steps);
  ASSERT_EQ(steps.size(), one_steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_NEAR(steps[i].loss, one_steps[i].loss, 1e-4 * one_steps[i].loss) << i;
    EXPECT_EQ(steps[i].loss_scale, one_steps[i].loss_scale) << i;
    EXPECT_EQ(steps[i].skipped, one_steps[i].skipped) << i;
  }
  EXPECT_TRUE(s.tied_copies_identical);
  comm().barrier();
}

// accrue-g2p's windows of variable-length sequences, normalised by their target tokens: 2 ranks
// x micro 32 x k 2 against one process with 128 x 1, float64, per-step loss and norm and final
// weights to 1e-10; the evaluation, shared between the ranks, equals the one-process result.
TEST(Dist, G2PTwoRanksEqualOneProcessAndShareTheEvaluation) {
  const auto dir = shared_g2p_fixture(comm(), "accrue-g2p-dist");
  g2p::Config c = small_g2p(dir, "fp64", 1);
  c.eval = "both";
  const auto run = [&](int64_t micro, int64_t k, distributed::Communicator* comm, const char* tag,
                       std::vector<train::StepEvent>& steps) {
    g2p::Config r = c;
    r.micro_batch = micro, r.accum_steps = k, r.comm = comm;
    return train_g2p(r, dir, tag, steps);
  };
  std::unique_ptr<distributed::Communicator> single = distributed::make_single_process();
  std::vector<train::StepEvent> one_steps, two_steps;
  // Each rank runs the one-process reference in a world of its own, where it leads and saves:
  // a file per rank.
  const std::string one_name = "one-" + std::to_string(comm().rank());
  const train::Summary one = run(128, 1, single.get(), one_name.c_str(), one_steps);
  const train::Summary two = run(32, 2, &comm(), "two", two_steps);
  ASSERT_EQ(one_steps.size(), 2u);
  ASSERT_EQ(two_steps.size(), one_steps.size());
  for (size_t i = 0; i < one_steps.size(); ++i) {
    EXPECT_EQ(two_steps[i].items, one_steps[i].items);
    EXPECT_NEAR(two_steps[i].loss, one_steps[i].loss, 1e-10 * one_steps[i].loss);
    EXPECT_NEAR(two_steps[i].grad_norm, one_steps[i].grad_norm, 1e-10 * one_steps[i].grad_norm);
  }
  if (comm().rank() == 0) {
    testing::expect_same_weights((dir / "two.safetensors").string(),
                                 (dir / (one_name + ".safetensors")).string(), 1e-10);
  }
  // Each rank decoded half the words; the sums over both are the one process's.
  for (const auto& [key, value] : one.evaluation.details.items()) {
    EXPECT_NEAR(two.evaluation.details.at(key).get<double>(), value.get<double>(),
                1e-9 * std::max(1.0, std::abs(value.get<double>())))
        << key;
  }
  EXPECT_EQ(two.evaluation.details.size(), 8u);
  comm().barrier();
  if (comm().rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace accrue
