// End-to-end benchmarks of the MNIST MLP (784-512-256-128-10): one micro-step (forward and
// backward of b samples, accumulating into the arena) and one boundary step (norm, clip, fused
// Adam, zero) over its 567,434 parameters.
#include "common.h"

namespace accrue::bench {

namespace {

struct Mlp {
  nn::MLP model{{784, 512, 256, 128, 10}};
  std::unique_ptr<optim::ParameterArena> arena;
  std::unique_ptr<optim::Adam> adam;
  Tensor x, y;
  Mlp(Device d, int64_t b) {
    model.to(d);
    arena = std::make_unique<optim::ParameterArena>(model);
    adam = std::make_unique<optim::Adam>(*arena);
    x = filled({b, 784}, d);
    std::vector<int32_t> labels(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) labels[i] = static_cast<int32_t>(i % 10);
    y = Tensor::from_vector<int32_t>({b}, labels, d);
  }
};

// Forward + backward of one micro-batch; samples/s is the figure to read.
void micro_step(benchmark::State& state, Device d) {
  const int64_t b = state.range(0);
  Mlp m(d, b);
  const double seconds =
      run_timed(state, d, [&] { backward(cross_entropy(m.model(m.x), m.y), 1.0 / 128); });
  state.counters["samples/s"] = double(b) * double(state.iterations()) / seconds;
}

// The boundary step over the MLP's arena: norm + clip scalars + fused Adam + zero.
void boundary(benchmark::State& state, Device d) {
  Mlp m(d, 1);
  const double seconds = run_timed(state, d, [&] { m.adam->step(1.0); });
  report_bytes(state, d, seconds, 36.0 * double(m.arena->size()), 16.0 * double(m.arena->size()));
}

}  // namespace

void register_mnist_benchmarks() {
  for (Device d : bench_devices()) {
    const std::string dev = d.str();
    auto* mb = benchmark::RegisterBenchmark(("mnist_micro_step/" + dev).c_str(),
                                            [=](benchmark::State& s) { micro_step(s, d); });
    mb->UseManualTime()->Arg(32);
    if (!smoke()) mb->Arg(64)->Arg(128);
    benchmark::RegisterBenchmark(("mnist_boundary_step/" + dev).c_str(), [=](benchmark::State& s) {
      boundary(s, d);
    })->UseManualTime();
  }
}

}  // namespace accrue::bench
