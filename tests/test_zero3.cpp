// ZeRO-3's schedule of gathers and releases (distributed/zero3.h) in one process, where a gather
// is a copy: which layers' parameters and gradient buffers each step of a micro-step holds, for
// each prefetch policy, with a layer that borrows another's parameters (as G2P's head borrows
// the token embedding); the values each gather brings; and the bytes gathered, the same whatever
// starts ahead. The ranks' runs are tests/test_dist_zero.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "distributed/counting.h"
#include "distributed/zero3.h"
#include "nn/linear.h"
#include "optim/arena.h"
#include "test_util.h"

namespace accrue {
namespace {

using distributed::ZeroPrefetch;

// Three layers; the third uses the first's parameters too. Each unit is padded to 16 elements
// per parameter: a 48 elements (32 + 8 -> 16), b 80, c 48.
struct ThreeLayers {
  nn::Linear a{4, 8}, b{8, 8}, c{8, 4};
  static constexpr size_t kA = 48 * 4, kB = 80 * 4, kC = 48 * 4;  // bytes in float32
  std::vector<nn::NamedTensor> named() {
    return {{"a.weight", a.weight()}, {"a.bias", a.bias()},     {"b.weight", b.weight()},
            {"b.bias", b.bias()},     {"c.weight", c.weight()}, {"c.bias", c.bias()}};
  }
  std::vector<distributed::ShardedLayers::Unit> units() {
    return {{"a", {a.weight(), a.bias()}},
            {"b", {b.weight(), b.bias()}},
            {"c", {c.weight(), c.bias()}}};
  }
};

// What the units hold after one call of the schedule.
struct Held {
  std::string after;
  std::function<void(distributed::ShardedLayers&)> call;
  size_t parameters, gradients;
};

std::vector<Held> schedule(ZeroPrefetch prefetch) {
  constexpr size_t A = ThreeLayers::kA, B = ThreeLayers::kB, C = ThreeLayers::kC;
  const bool forward = prefetch != ZeroPrefetch::kNone;
  const bool backward = prefetch == ZeroPrefetch::kForwardAndBackward;
  using L = distributed::ShardedLayers;
  return {
      {"begin_window", [](L& l) { l.begin_window(); }, 0, 0},
      {"before_forward(0)", [](L& l) { l.before_forward(0); }, forward ? A + B : A, 0},
      {"after_forward(0)", [](L& l) { l.after_forward(0); }, forward ? B : 0, 0},
      // Layer 2 uses c and a: both start ahead.
      {"before_forward(1)", [](L& l) { l.before_forward(1); }, forward ? B + C + A : B, 0},
      {"after_forward(1)", [](L& l) { l.after_forward(1); }, forward ? C + A : 0, 0},
      {"before_forward(2)", [](L& l) { l.before_forward(2); }, C + A, 0},
      {"after_forward(2)", [](L& l) { l.after_forward(2); }, 0, 0},
      // Layer 1's parameters start ahead of layer 2's backward.
      {"before_backward(2)", [](L& l) { l.before_backward(2); }, backward ? C + A + B : C + A,
       C + A},
      // c is reduce-scattered and released; a is released too, but its gradient buffer stays
      // until layer 0's backward is done. Layer 0's parameters (a) start ahead.
      {"before_backward(1)", [](L& l) { l.before_backward(1); }, backward ? B + A : B, B + A},
      {"before_backward(0)", [](L& l) { l.before_backward(0); }, A, A},
      {"after_backward", [](L& l) { l.after_backward(); }, 0, 0},
  };
}

// The watchdog's limit set through the counting wrapper reaches the communicator that waits.
TEST(Zero3, TheCountingWrapperPassesItsTimeoutOn) {
  const auto single = distributed::make_single_process();
  single->set_timeout(42);
  distributed::CountingCommunicator counted(*single);
  EXPECT_EQ(counted.timeout(), 42);
  counted.set_timeout(7);
  EXPECT_EQ(counted.timeout(), 7);
  EXPECT_EQ(single->timeout(), 7);
}

TEST(Zero3, EachPrefetchHoldsTheLayersItSaysAndGathersTheSameBytes) {
  size_t gathered_without_prefetch = 0;
  for (ZeroPrefetch prefetch :
       {ZeroPrefetch::kNone, ZeroPrefetch::kForward, ZeroPrefetch::kForwardAndBackward}) {
    SCOPED_TRACE(distributed::zero_prefetch_name(prefetch));
    ThreeLayers model;
    const std::vector<Tensor> before = {model.a.weight().clone(), model.b.weight().clone(),
                                        model.c.weight().clone()};
    const auto single = distributed::make_single_process();
    distributed::CountingCommunicator counted(*single);
    distributed::ShardedLayers layers(model.units(), {{0}, {1}, {2, 0}}, model.named(), counted,
                                      DType::kFloat32, DType::kFloat32, Device::cpu(), prefetch);
    optim::ParameterArena arena(layers.shards(), 1);
    EXPECT_EQ(arena.size() * 4, ThreeLayers::kA + ThreeLayers::kB + ThreeLayers::kC);
    layers.bind(arena);
    for (const Held& h : schedule(prefetch)) {
      h.call(layers);
      EXPECT_EQ(layers.held_parameter_bytes(), h.parameters) << "after " << h.after;
      EXPECT_EQ(layers.held_gradient_bytes(), h.gradients) << "after " << h.after;
      // The layer about to compute sees its own values, gathered on demand or ahead.
      for (int i = 0; i < 3; ++i) {
        if (h.after == str_cat("before_forward(", i, ")") ||
            h.after == str_cat("before_backward(", i, ")")) {
          const nn::Linear& l = i == 0 ? model.a : i == 1 ? model.b : model.c;
          EXPECT_EQ(l.weight().to_vector<float>(), before[i].to_vector<float>()) << h.after;
        }
      }
    }
    // a b c a forward, c a b a backward.
    const size_t gathered = counted.bytes().all_gather;
    EXPECT_EQ(gathered, 4 * ThreeLayers::kA + 2 * ThreeLayers::kB + 2 * ThreeLayers::kC);
    if (prefetch == ZeroPrefetch::kNone) gathered_without_prefetch = gathered;
    EXPECT_EQ(gathered, gathered_without_prefetch);
  }
}

// A first layer without parameters (an input scaling) records no mark, so its before_backward
// never runs in a real micro-step: after_backward takes its step. Every unit is reduce-scattered
// once, and a real micro-step runs the collectives a phantom one does (a rank without a
// micro-batch in a short window would otherwise wait on a reduce-scatter the others never start).
TEST(Zero3, AFirstLayerWithoutParametersStillReduceScattersTheNext) {
  constexpr size_t kA = 48 * 4, kB = 48 * 4;  // (32 -> 32) + (8 -> 16), (32) + (4 -> 16) floats
  for (ZeroPrefetch prefetch :
       {ZeroPrefetch::kNone, ZeroPrefetch::kForward, ZeroPrefetch::kForwardAndBackward}) {
    SCOPED_TRACE(distributed::zero_prefetch_name(prefetch));
    nn::Linear a{4, 8}, b{8, 4};  // the layers' parameters become views of their units
    const std::vector<nn::NamedTensor> named = {{"a.weight", a.weight()},
                                                {"a.bias", a.bias()},
                                                {"b.weight", b.weight()},
                                                {"b.bias", b.bias()}};
    const auto single = distributed::make_single_process();
    distributed::CountingCommunicator counted(*single);
    distributed::ShardedLayers layers(
        {{"scale", {}}, {"a", {a.weight(), a.bias()}}, {"b", {b.weight(), b.bias()}}},
        {{0}, {1}, {2}}, named, counted, DType::kFloat32, DType::kFloat32, Device::cpu(), prefetch);
    optim::ParameterArena arena(layers.shards(), 1);
    ASSERT_EQ(arena.size() * 4, kA + kB);
    layers.bind(arena);
    layers.begin_window();
    for (int i = 0; i < 3; ++i) {
      layers.before_forward(i);
      layers.after_forward(i);
    }
    layers.before_backward(2);
    layers.before_backward(1);  // layer 0's output needs no gradient: no mark, no call
    layers.after_backward();
    EXPECT_EQ(counted.bytes().reduce_scatter, kA + kB) << "a unit's gradient was dropped";
    EXPECT_EQ(layers.held_parameter_bytes(), 0u);
    EXPECT_EQ(layers.held_gradient_bytes(), 0u);
    const distributed::CollectiveBytes real = counted.bytes();
    layers.phantom_micro_step();
    EXPECT_EQ(counted.bytes().reduce_scatter, 2 * real.reduce_scatter);
    EXPECT_EQ(counted.bytes().all_gather, 2 * real.all_gather);
  }
}

TEST(Zero3, PrefetchPolicyNamesRoundTripAndAWrongOneIsNamed) {
  for (ZeroPrefetch p :
       {ZeroPrefetch::kNone, ZeroPrefetch::kForward, ZeroPrefetch::kForwardAndBackward}) {
    EXPECT_EQ(distributed::parse_zero_prefetch(distributed::zero_prefetch_name(p)), p);
  }
  testing::expect_error<ValueError>([] { distributed::parse_zero_prefetch("backward"); },
                                    {"backward", "none, forward, forward-and-backward"});
}

}  // namespace
}  // namespace accrue
