// The optimizer step through optim::Adam, on the compute device and offloaded (optim/offload.h),
// on the same arena of n float32 parameters: what offloading costs at the boundary.
//
// On the device, one step moves 36 bytes an element (norm 4, fused Adam 32). Offloaded, 56: the
// gradient copied to the host (read 4, write 4), the device gradient zeroed (4), the norm (4) and
// Adam (32) on the host, the new weights copied back (read 4, write 4). On the CPU all of it is
// memory traffic and `roofline` compares it with the same-run copy bandwidth; on a GPU 8 of the
// 56 bytes cross the host link, which `link_bytes_per_second` reports on its own (no same-run
// limit is measured for the link, so `roofline` there is only the device-memory share).
#include "common.h"

namespace accrue::bench {

namespace {

using benchmark::State;

// One parameter vector of n elements.
struct Flat : nn::Module {
  explicit Flat(int64_t n) { register_parameter("p", full({n}, 0.5)); }
  Tensor forward(const Tensor& x) override { return x; }
};

void optimizer_step(State& state, Device d, bool offloaded) {
  const int64_t n = state.range(0);
  Flat model(n);
  model.to(d);
  optim::ParameterArena arena(model);
  if (offloaded) arena.offload_masters();
  optim::Adam adam(arena);
  // The copies around the step when offloaded: the gradient out (fetch), the weights back.
  std::unique_ptr<optim::HostOffload> offload;
  if (offloaded) offload = std::make_unique<optim::HostOffload>(adam);
  const Tensor gradient = filled({arena.size()}, d, 3);
  // The gradient is refilled before each step, outside the timed region.
  double seconds = 0;
  for (auto _ : state) {
    arena.grads().copy_(gradient);
    synchronize(d);
    const auto t0 = std::chrono::steady_clock::now();
    if (offload) offload->finish();
    adam.step(1.0);
    synchronize(d);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    seconds += s;
  }
  const double elements = static_cast<double>(arena.size());
  report_bytes(state, d, seconds, (offloaded ? 56.0 : 36.0) * elements,
               (offloaded ? 24.0 : 16.0) * elements);
  if (offloaded) {
    state.counters["link_bytes_per_second"] =
        8.0 * elements * static_cast<double>(state.iterations()) / seconds;
  }
}

}  // namespace

void register_offload_benchmarks() {
  for (Device d : bench_devices()) {
    std::vector<int64_t> sizes{567434};  // the MNIST MLP
    if (smoke()) sizes = {10000};
    if (!smoke()) sizes.push_back(10000000);
    for (int64_t n : sizes) {
      for (bool offloaded : {false, true}) {
        const std::string name =
            str_cat(offloaded ? "optimizer_step_offloaded/" : "optimizer_step/", d.str());
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](State& s) { optimizer_step(s, d, offloaded); })
            ->Arg(n)
            ->UseManualTime();
      }
    }
  }
}

}  // namespace accrue::bench
