// The tape: recording rules, release of saved tensors and intermediate gradients during
// backward, the empty tape afterwards, the no-grad guard, and in-place leaf accumulation.
#include "test_util.h"

namespace accrue::testing {
namespace {

TEST(Autograd, RecordsOnlyWhenAnInputRequiresGrad) {
  Tensor a = random({3}, 1);
  Tensor b = random({3}, 2);
  Tensor c = add(a, b);
  EXPECT_FALSE(c.requires_grad());
  EXPECT_EQ(tape_size(), 0u);
  a.set_requires_grad(true);
  Tensor d = mul(add(a, b), b);
  EXPECT_TRUE(d.requires_grad());
  EXPECT_FALSE(d.is_leaf());
  EXPECT_EQ(tape_size(), 2u);
  clear_tape();
}

TEST(Autograd, NoGradGuardDisablesRecording) {
  Tensor a = random({3}, 1);
  a.set_requires_grad(true);
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    Tensor y = relu(a);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(tape_size(), 0u);
  }
  EXPECT_TRUE(grad_enabled());
}

TEST(Autograd, BackwardEmptiesTheTapeAndFreesActivations) {
  CachingAllocator& alloc = allocator_for(Device::cpu());
  Tensor w = random({64, 64}, 1, DType::kFloat32);
  w.set_requires_grad(true);
  Tensor x = random({32, 64}, 2, DType::kFloat32);
  // Warm the gradient buffer so its allocation is not counted below.
  backward(sum(matmul(x, w)));
  const size_t baseline = alloc.stats().live_bytes;
  Tensor loss = sum(relu(matmul(relu(matmul(x, w)), w)));
  EXPECT_GT(alloc.stats().live_bytes, baseline);
  EXPECT_EQ(tape_size(), 5u);
  backward(loss);
  EXPECT_EQ(tape_size(), 0u);
  loss = Tensor();  // the only activation a caller still holds
  EXPECT_EQ(alloc.stats().live_bytes, baseline);
}

// Two micro-batches in flight at once, each on its own tape (a pipeline stage's 1F1B): their
// backwards, in either order, give the gradient the two micro-steps give one after the other,
// free every activation, and leave both tapes and the thread's own tape empty.
TEST(Autograd, MicroBatchesInFlightOnTheirOwnTapes) {
  CachingAllocator& alloc = allocator_for(Device::cpu());
  Tensor w = random({16, 16}, 1);
  w.set_requires_grad(true);
  const Tensor a = random({8, 16}, 2), b = random({8, 16}, 3);
  const auto forward = [&](const Tensor& x) { return sum(relu(matmul(tanh(matmul(x, w)), w))); };
  backward(forward(a), 0.5);
  backward(forward(b), 0.25);
  const Tensor expected = w.grad().clone();
  w.grad().zero_();
  const size_t baseline = alloc.stats().live_bytes;
  Tape first, second;
  Tensor loss_a, loss_b;
  {
    const TapeScope scope(first);
    loss_a = forward(a);
  }
  {
    const TapeScope scope(second);
    loss_b = forward(b);
    EXPECT_EQ(tape_size(), second.size());
  }
  EXPECT_EQ(first.size(), 5u);
  EXPECT_EQ(second.size(), 5u);
  EXPECT_EQ(tape_size(), 0u);  // the thread's own tape saw nothing
  // A loss is only backward-able under the scope of its tape.
  EXPECT_THROW(backward(loss_a), AutogradError);
  {
    const TapeScope scope(first);
    EXPECT_THROW(backward(loss_b, 0.25), AutogradError);
    EXPECT_THROW(TapeScope again(first), AutogradError);
  }
  {
    const TapeScope scope(second);
    backward(loss_b, 0.25);
  }
  {
    const TapeScope scope(first);
    backward(loss_a, 0.5);
  }
  EXPECT_TRUE(first.empty());
  EXPECT_TRUE(second.empty());
  EXPECT_LT(max_rel_error(w.grad(), expected), 1e-14);  // summed in the other order
  loss_a = loss_b = Tensor();
  EXPECT_EQ(alloc.stats().live_bytes, baseline);
}

TEST(Autograd, ChainRuleThroughSharedIntermediates) {
  // y = sum(h * h + h), h = 2x: dy/dx = 2 * (2h + 1)
  Tensor x = Tensor::from_vector<double>({3}, {1, -2, 0.5});
  x.set_requires_grad(true);
  Tensor h = scale(x, 2.0);
  backward(sum(add(mul(h, h), h)));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{10, -14, 6}));
}

TEST(Autograd, SeedScalesTheGradient) {
  Tensor x = Tensor::from_vector<double>({2}, {1, 2});
  x.set_requires_grad(true);
  backward(sum(mul(x, x)), 0.25);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0.5, 1.0}));
  Tensor y = scale(x, 3.0);
  backward(y, Tensor::from_vector<double>({2}, {1, -1}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3.5, -2.0}));
}

TEST(Autograd, LeafGradientBufferIsAccumulatedInPlace) {
  Tensor w = Tensor::from_vector<float>({2}, {1, 1});
  w.set_requires_grad(true);
  Tensor buffer = full({2}, 10.0);
  w.set_grad(buffer);
  backward(sum(scale(w, 2.0)));
  EXPECT_EQ(buffer.to_vector<float>(), (std::vector<float>{12, 12}));
  EXPECT_EQ(w.grad().raw(), buffer.raw());
}

TEST(Autograd, UnusedBranchesGetNoGradient) {
  Tensor a = random({2}, 1), b = random({2}, 2);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor unused = relu(b);
  backward(sum(a));
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_EQ(tape_size(), 0u);
}

// A backward that calls recorded ops (mul's multiplies dy by saved activations that require
// grad) records nothing: the tape it walks keeps its length, the gradients it hands on require no
// grad, and the activations go as their nodes run.
TEST(Autograd, BackwardRecordsNothingOfItsOwn) {
  Tensor p = random({4, 8}, 1);
  p.set_requires_grad(true);
  const Tensor h = tanh(p);
  const Tensor loss = sum(mul(h, h));  // tape: tanh, mul, sum
  ASSERT_EQ(tape_size(), 3u);
  size_t tape_when_ready = 0;
  bool grad_required = true;
  {
    ScopedLeafReadyHook hook([&](const TensorImpl&) {
      tape_when_ready = tape_size();
      grad_required = p.grad().requires_grad();
    });
    backward(loss);
  }
  EXPECT_EQ(tape_when_ready, 3u) << "the backward walk recorded nodes of its own";
  EXPECT_FALSE(grad_required);
  EXPECT_EQ(tape_size(), 0u);
  EXPECT_TRUE(grad_enabled());
  // d/dp sum(tanh(p)^2) = 2 tanh(p) (1 - tanh(p)^2)
  const std::vector<double> pv = p.to_vector<double>(), g = p.grad().to_vector<double>();
  for (size_t i = 0; i < pv.size(); ++i) {
    const double t = std::tanh(pv[i]);
    EXPECT_NEAR(g[i], 2 * t * (1 - t * t), 1e-12);
  }
}

}  // namespace
}  // namespace accrue::testing

namespace accrue {
namespace {

// The leaf-ready hook fires once per leaf, after the last node that feeds it: w is used by two
// matmuls and reported only after the second (the earlier on the tape) has run; b after its one
// use; x needs no gradient and is never reported.
TEST(Autograd, LeafReadyHookFiresOnceAfterTheLastContribution) {
  Tensor x = Tensor::from_vector<double>({1, 2}, {1, 2});
  Tensor w = Tensor::from_vector<double>({2, 2}, {1, 0, 0, 1});
  Tensor b = Tensor::from_vector<double>({1, 2}, {3, 4});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor h = matmul(x, w);          // node 0: reads w
  const Tensor y = matmul(add(h, b), w);  // node 1: add reads b; node 2: reads w again
  std::vector<std::string> order;
  std::vector<double> w_grad_when_ready;
  {
    ScopedLeafReadyHook hook([&](const TensorImpl& leaf) {
      if (&leaf == w.impl().get()) {
        order.push_back("w");
        w_grad_when_ready = w.grad().to_vector<double>();
      }
      if (&leaf == b.impl().get()) order.push_back("b");
    });
    backward(sum(y));
  }
  EXPECT_EQ(order, (std::vector<std::string>{"b", "w"}));
  EXPECT_EQ(w_grad_when_ready, w.grad().to_vector<double>()) << "reported before it was final";
}

}  // namespace
}  // namespace accrue
