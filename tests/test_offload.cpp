// The offloaded optimizer (optim/offload.h): masters and optimizer state in pinned host memory,
// the step on the CPU between copying the gradient out and the weights back. With the model on
// the CPU the same kernels run on the same values, so offloaded and on-device training must agree
// to the bit; on a GPU the host's Adam against the device's, within rounding. Also: what the
// compute device no longer holds, measured with the allocators; the copies' traffic and their
// overlap with the last backward; an abandoned window; misuse.
#include "test_util.h"

namespace accrue::testing {
namespace {

enum class Opt { kAdam, kAdamW, kSgd };

struct Trainee {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::ParameterArena> arena;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::HostOffload> offload;  // the copies, when offloaded
  std::unique_ptr<optim::Accumulator> acc;
  Tensor x, y;
};

struct Variant {
  DType master = DType::kFloat32;
  DType working = DType::kFloat32;  // == master: no working copy
  Opt opt = Opt::kAdam;
  double loss_scale = 0;  // > 0: dynamic loss scaling from this scale
  size_t bucket_bytes = 0;
  Device device = Device::cpu();
};

std::string describe(const Variant& v) {
  const char* opt = v.opt == Opt::kAdam ? "adam" : v.opt == Opt::kAdamW ? "adamw" : "sgd";
  return str_cat(dtype_name(v.master), "/", dtype_name(v.working), " ", opt, " scale ",
                 v.loss_scale, " buckets ", v.bucket_bytes, " on ", v.device.str());
}

// A small MLP and 96 labelled samples; offloaded or not.
Trainee make_trainee(const Variant& v, bool offload) {
  Trainee s;
  nn::manual_seed(5);
  s.model = std::make_shared<nn::Sequential>();
  s.model->add(std::make_shared<nn::Linear>(10, 48, true, v.master));
  s.model->add(std::make_shared<nn::ReLU>());
  s.model->add(std::make_shared<nn::Linear>(48, 24, true, v.master));
  s.model->add(std::make_shared<nn::Tanh>());
  s.model->add(std::make_shared<nn::Linear>(24, 4, true, v.master));
  s.model->to(v.device);
  s.arena = std::make_unique<optim::ParameterArena>(*s.model);
  if (v.working != v.master) s.arena->use_working_copy(v.working);
  if (offload) s.arena->offload_masters();
  switch (v.opt) {
    case Opt::kAdam:
      s.optimizer = std::make_unique<optim::Adam>(*s.arena);
      break;
    case Opt::kAdamW:
      s.optimizer = std::make_unique<optim::AdamW>(*s.arena);
      break;
    case Opt::kSgd: {
      optim::SgdOptions o;
      o.lr = 0.05;
      o.momentum = 0.9;
      o.weight_decay = 1e-3;
      s.optimizer = std::make_unique<optim::SGD>(*s.arena, o);
    }
  }
  if (offload) s.offload = std::make_unique<optim::HostOffload>(*s.optimizer);
  if (v.loss_scale > 0) {
    LossScaling ls;
    ls.dynamic = true;
    ls.growth_interval = 3;
    s.optimizer->set_loss_scaling(ls, v.loss_scale);
  }
  optim::AccumulatorOptions o;
  o.max_norm = 0.5;  // clips some windows
  o.base_lr = v.opt == Opt::kSgd ? 0.05 : 3e-3;
  o.bucket_bytes = v.bucket_bytes;
  o.gradients = s.offload.get();  // null on the device: nothing to consume
  s.acc = std::make_unique<optim::Accumulator>(*s.optimizer, o);
  s.x = to_dtype(random({96, 10}, 8, DType::kFloat64, -2, 2), v.working).to(v.device);
  std::vector<int32_t> labels(96);
  for (int i = 0; i < 96; ++i) labels[i] = (i * 7 + i / 5) % 4;
  s.y = Tensor::from_vector<int32_t>({96}, labels, v.device);
  return s;
}

// One window of `total` samples from `start` in micro-batches of `micro`; `poison` > 0 scales the
// loss of the window's first micro-batch by it (an overflow, to exercise the skip).
optim::StepResult window(Trainee& s, int64_t start, int64_t total, int64_t micro,
                         double poison = 0) {
  s.acc->begin_window(total);
  for (int64_t at = start; at < start + total; at += micro) {
    s.acc->micro_step(micro, [&] {
      const Tensor logits = cast((*s.model)(s.x.narrow(at, micro)), s.arena->dtype());
      Tensor loss = cross_entropy(logits, s.y.narrow(at, micro));
      return poison > 0 && at == start ? scale(loss, poison) : loss;
    });
  }
  return s.acc->step();
}

// Eight windows of 32 in micro-batches of 8 (the fifth poisoned when `poison`), both ways; the
// per-step results and the final masters, working copies and optimizer state compared.
void expect_same_training(const Variant& v, double tolerance, double poison = 0) {
  SCOPED_TRACE(describe(v));
  Trainee on_device = make_trainee(v, false), offloaded = make_trainee(v, true);
  for (int step = 0; step < 8; ++step) {
    const double p = step == 4 ? poison : 0;
    const optim::StepResult a = window(on_device, (step % 3) * 32, 32, 8, p);
    const optim::StepResult b = window(offloaded, (step % 3) * 32, 32, 8, p);
    ASSERT_EQ(a.skipped, b.skipped) << "step " << step;
    EXPECT_EQ(a.skipped, p > 0) << "step " << step << ": only the poisoned window skips";
    EXPECT_EQ(a.loss_scale, b.loss_scale) << "step " << step;
    if (tolerance == 0) {
      EXPECT_EQ(a.loss, b.loss) << "step " << step;
      if (std::isnan(a.grad_norm)) {  // the overflowing window
        EXPECT_TRUE(std::isnan(b.grad_norm)) << "step " << step << ": " << b.grad_norm;
      } else {
        EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
      }
    } else {
      EXPECT_NEAR(a.loss, b.loss, tolerance * std::abs(a.loss)) << "step " << step;
    }
  }
  EXPECT_EQ(on_device.optimizer->applied_steps(), offloaded.optimizer->applied_steps());
  EXPECT_EQ(on_device.optimizer->scaler_state(), offloaded.optimizer->scaler_state());
  const auto same = [&](const Tensor& a, const Tensor& b, const char* what) {
    if (tolerance == 0) {
      EXPECT_EQ(as_doubles(a), as_doubles(b)) << what;
    } else {
      EXPECT_LE(max_rel_error(b, a), tolerance) << what;
    }
  };
  same(on_device.arena->masters(), offloaded.arena->masters(), "masters");
  // What the model computes with: the on-device arena's working copy or masters, and the
  // offloaded arena's device copy.
  const Tensor computed = on_device.arena->working().defined() ? on_device.arena->working()
                                                               : on_device.arena->masters();
  same(computed, offloaded.arena->working(), "the weights the model computes with");
  EXPECT_EQ(offloaded.arena->working().device(), v.device);
  EXPECT_EQ(as_doubles(offloaded.arena->grads()), std::vector<double>(offloaded.arena->size(), 0.0))
      << "the device gradient is zero after the step";
  const auto state_a = on_device.optimizer->save_state(),
             state_b = offloaded.optimizer->save_state();
  ASSERT_EQ(state_a.size(), state_b.size());
  for (size_t i = 0; i < state_a.size(); ++i) {
    EXPECT_EQ(state_b[i].second.device(), Device::cpu()) << state_b[i].first;
    same(state_a[i].second, state_b[i].second, state_a[i].first.c_str());
  }
}

TEST(Offload, TrainsBitForBitLikeTheOnDeviceOptimizerOnTheCpu) {
  for (Opt opt : {Opt::kAdam, Opt::kAdamW, Opt::kSgd}) {
    for (size_t bucket : {size_t{0}, size_t{1024}}) {
      expect_same_training({DType::kFloat32, DType::kFloat32, opt, 0, bucket}, 0);
    }
  }
  expect_same_training({DType::kFloat64, DType::kFloat64, Opt::kAdam, 0, 2048}, 0);
  expect_same_training({DType::kFloat32, DType::kBFloat16, Opt::kAdam, 0, 1024}, 0);
  expect_same_training({DType::kFloat32, DType::kBFloat16, Opt::kSgd, 0, 0}, 0);
  // float16 with dynamic loss scaling, an overflowing window in the middle: the same skip, the
  // same backoff, the same growth afterwards.
  expect_same_training({DType::kFloat32, DType::kFloat16, Opt::kAdam, 1024, 1024}, 0, 1e30);
}

TEST(Offload, OnEveryOtherDeviceMatchesItsOwnOptimizerWithinRounding) {
  ACCRUE_REQUIRE_CUDA();
  for (const Device d : devices()) {
    if (d.is_cpu()) continue;
    // The host's fused pass against the device's: the same formulas, another compiler's
    // contractions; rounding differences compound over eight steps.
    expect_same_training({DType::kFloat32, DType::kFloat32, Opt::kAdam, 0, 1024, d}, 1e-5);
    expect_same_training({DType::kFloat32, DType::kBFloat16, Opt::kAdam, 0, 1024, d}, 1e-2);
    expect_same_training({DType::kFloat32, DType::kFloat16, Opt::kSgd, 1024, 0, d}, 1e-2, 1e30);
  }
}

// Live bytes on the compute device (and in pinned host memory) once the model, its arena and its
// optimizer are built.
struct Footprint {
  int64_t device, pinned, arena_size;
};
Footprint footprint(const Variant& v, bool offload) {
  CachingAllocator& dev = allocator_for(v.device);
  CachingAllocator& pinned = pinned_host_allocator();
  const int64_t dev0 = static_cast<int64_t>(dev.stats().live_bytes);
  const int64_t pinned0 = static_cast<int64_t>(pinned.stats().live_bytes);
  nn::manual_seed(1);
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(256, 512));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::Linear>(512, 128));
  model.to(v.device);
  optim::ParameterArena arena(model);
  if (v.working != v.master) arena.use_working_copy(v.working);
  if (offload) arena.offload_masters();
  optim::Adam adam(arena);
  return {static_cast<int64_t>(dev.stats().live_bytes) - dev0,
          static_cast<int64_t>(pinned.stats().live_bytes) - pinned0, arena.size()};
}

TEST(Offload, TheDeviceHoldsTwelveBytesAParameterLessWithMixedPrecision) {
  for (const Device d : devices()) {
    // bf16: 4 (master) + 2 (working) + 4 (gradient) + 8 (moments) = 18 bytes a parameter on the
    // device; offloaded, 2 + 4 = 6 there, and master, moments, the host gradient and the host
    // working copy, 18, pinned. fp32: the device keeps a float32 copy to compute with: 16 -> 8.
    for (const auto& [working, saved, pinned] :
         {std::tuple{DType::kBFloat16, 12, 18}, std::tuple{DType::kFloat32, 8, 16}}) {
      const Variant v{DType::kFloat32, working, Opt::kAdam, 0, 0, d};
      const Footprint plain = footprint(v, false), off = footprint(v, true);
      SCOPED_TRACE(describe(v));
      const int64_t n = plain.arena_size;
      // The boundary scalars, the step counter and a 16-element arena padding round each tensor
      // to the allocator's granule: a few KiB either way.
      const int64_t slack = 8 * static_cast<int64_t>(CachingAllocator::kGranule);
      EXPECT_NEAR(plain.device - off.device, saved * n, slack)
          << plain.device << " -> " << off.device << " bytes for " << n << " parameters";
      EXPECT_NEAR(off.pinned, pinned * n, slack);
      EXPECT_NEAR(plain.pinned, 0, slack);
    }
  }
}

TEST(Offload, GradientCopiesStartDuringTheLastBackwardAndWeightsReturnOnce) {
  for (const auto& [working, back] :
       {std::pair{DType::kFloat32, 4}, std::pair{DType::kBFloat16, 2}}) {
    Variant v{DType::kFloat32, working, Opt::kAdam, 0, 1024};
    Trainee s = make_trainee(v, true);
    const int64_t n = s.arena->size();
    for (int step = 1; step <= 3; ++step) window(s, 0, 32, 8);
    const optim::OffloadTraffic& t = s.offload->traffic();
    EXPECT_EQ(t.steps, 3);
    EXPECT_EQ(t.to_host_bytes, size_t(3 * 4 * n)) << "the gradient once a step";
    EXPECT_EQ(t.from_host_bytes, size_t(3 * back * n)) << "the weights once a step";
    // Every parameter gets its gradient, so every bucket is copied during backward.
    EXPECT_GT(t.prefetched, 3);
    EXPECT_EQ(t.fetched_at_step, 0);
    EXPECT_EQ(s.acc->buckets_overlapped(), t.prefetched);
    // A skipped step moves no weights.
    v.loss_scale = 1024;
    Trainee k = make_trainee(v, true);
    EXPECT_TRUE(window(k, 0, 32, 8, 1e30).skipped);
    EXPECT_EQ(k.offload->traffic().from_host_bytes, 0u);
    EXPECT_EQ(k.offload->traffic().to_host_bytes, size_t(4 * n));
  }
}

// A window abandoned after part of its gradient was copied leaves nothing behind: the next window
// gives what it gives from a clean start.
TEST(Offload, AnAbandonedWindowLeavesNoCopiedGradientBehind) {
  const Variant v{DType::kFloat32, DType::kFloat32, Opt::kAdam, 0, 512};
  Trainee a = make_trainee(v, true), b = make_trainee(v, true);
  a.acc->begin_window(32);
  a.acc->micro_step(8,
                    [&] { return cross_entropy((*a.model)(a.x.narrow(0, 8)), a.y.narrow(0, 8)); });
  a.offload->prefetch(0, 64);
  a.acc->abandon_window();
  EXPECT_EQ(as_doubles(a.arena->grads()), std::vector<double>(a.arena->size(), 0.0));
  const optim::StepResult ra = window(a, 32, 32, 8), rb = window(b, 32, 32, 8);
  EXPECT_EQ(ra.loss, rb.loss);
  EXPECT_EQ(ra.grad_norm, rb.grad_norm);
  EXPECT_EQ(as_doubles(a.arena->masters()), as_doubles(b.arena->masters()));
}

TEST(Offload, MisuseIsRejectedWithTheReason) {
  const Variant v{};
  struct Row {
    const char* what;
    std::function<void()> body;
    std::vector<std::string> words;
  };
  const std::vector<Row> rows{
      {"offloading twice",
       [&] {
         Trainee s = make_trainee(v, true);
         s.arena->offload_masters();
       },
       {"offloaded already"}},
      {"a working copy after offloading",
       [&] {
         Trainee s = make_trainee(v, true);
         s.arena->use_working_copy(DType::kBFloat16);
       },
       {"use_working_copy", "after offload_masters"}},
      {"a host offload of an arena on the device",
       [&] {
         Trainee s = make_trainee(v, false);
         optim::HostOffload h(*s.optimizer);
       },
       {"offload_masters()"}},
      {"a ZeRO slice outside the arena",
       [&] {
         Trainee s = make_trainee(v, true);
         s.offload->restrict_to(0, s.arena->size() + 1);
       },
       {"[offload] slice [0, ", "outside the arena"}},
      {"a prefetch outside the arena",
       [&] {
         Trainee s = make_trainee(v, true);
         s.offload->prefetch(0, s.arena->size() + 1);
       },
       {"prefetch of elements [0, ", "outside the arena"}},
      {"a prefetch that overlaps an earlier one",
       [&] {
         Trainee s = make_trainee(v, true);
         s.offload->prefetch(0, 64);
         s.offload->prefetch(32, 96);
       },
       {"[32, 96)", "overlaps [0, 64)"}},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    expect_error<ValueError>(r.body, r.words);
  }
}

}  // namespace
}  // namespace accrue::testing
