// Shared by the benchmarks: the devices to measure, the same-run limits every result is
// compared with (copy bandwidth and large-GEMM FLOP/s per device), and the counters.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "accrue.h"

namespace accrue::bench {

// Memory bandwidth depends on how much memory is touched (caches, and on virtual machines even
// beyond the last-level cache), so it is measured at footprints from 64 KiB up in steps of 2, as
// the best of several streaming kernels (limits.cpp), and a kernel is compared with the limit at
// the footprint nearest its own.
struct Limits {
  std::map<int64_t, double> copy_bytes_per_second;  // footprint bytes -> read + write bytes/s
  double gemm_flops_per_second = 0;                 // a large square float32 GEMM
  // The copy bandwidth measured at the footprint nearest (in ratio) to `footprint`.
  double copy_at(double footprint) const;
  double copy_largest() const { return copy_bytes_per_second.rbegin()->second; }
};

// Set once in main() before any benchmark runs; keyed by Device::str().
std::map<std::string, Limits>& limits();
// True with --smoke: every benchmark at its smallest size, for CI.
bool& smoke();
std::vector<Device> bench_devices();

// Runs prepare() and then body once per iteration, waits for the device after each, and records
// the wall time of body alone as the iteration's manual time (benchmarks register with
// UseManualTime). prepare restores what body consumes (a gradient the optimizer zeroes).
// One untimed call comes first: a first call pays for plans, library handles and lazily loaded
// GPU kernels (cuDNN's first convolution: 144 ms on an H200), and a row whose first call
// outlasts the minimum time would time that call alone. Returns the total.
template <typename P, typename F>
double run_timed_after(benchmark::State& state, Device device, P prepare, F body) {
  prepare();
  body();
  synchronize(device);
  double total = 0;
  for (auto _ : state) {
    prepare();
    synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    body();
    synchronize(device);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  return total;
}

// run_timed_after with nothing to prepare.
template <typename F>
double run_timed(benchmark::State& state, Device device, F body) {
  return run_timed_after(
      state, device, [] {}, body);
}

// Bytes/s and the fraction of the same-run copy bandwidth at the same memory footprint.
inline void report_bytes(benchmark::State& state, Device device, double seconds,
                         double bytes_per_iteration, double footprint_bytes) {
  const double bytes = bytes_per_iteration * double(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["roofline"] = bytes / seconds / limits()[device.str()].copy_at(footprint_bytes);
  state.counters["footprint_MiB"] = footprint_bytes / (1 << 20);
}

// FLOP/s and the fraction of the same-run large GEMM.
inline void report_flops(benchmark::State& state, Device device, double seconds,
                         double flops_per_iteration) {
  const double rate = flops_per_iteration * double(state.iterations()) / seconds;
  state.counters["FLOP/s"] = rate;
  state.counters["roofline"] = rate / limits()[device.str()].gemm_flops_per_second;
}

inline Tensor filled(const Shape& shape, Device device, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  return uniform(shape, -1, 1, rng, DType::kFloat32, device);
}

}  // namespace accrue::bench
