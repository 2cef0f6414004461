// accrue-bench: Google Benchmark over accrue's kernels and the MNIST MLP on every device
// present. Accepts Google Benchmark's flags, plus --smoke (every benchmark once at its smallest
// size: what CI runs). The limits used for `roofline` are measured first and printed.
#include <cstring>
#include <iostream>

#include "common.h"
#include "kernels/cpu/blas_core.h"

namespace accrue::bench {
Limits measure_limits(Device device);
void register_kernel_benchmarks();
void register_mnist_benchmarks();
void register_offload_benchmarks();
}  // namespace accrue::bench

int main(int argc, char** argv) {
  using namespace accrue;
  cpu::run_with_cpu_blas_kernels(argv);  // rates of the kernels the CPU has, not a fallback's
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) {
      bench::smoke() = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 2;
  for (Device d : bench::bench_devices()) {
    const bench::Limits l = bench::measure_limits(d);
    bench::limits()[d.str()] = l;
    benchmark::AddCustomContext("device:" + d.str(), device_name(d));
    std::string copies;
    for (const auto& [bytes, rate] : l.copy_bytes_per_second) {
      copies += (copies.empty() ? "" : ", ") + std::to_string(bytes >> 10) +
                " KiB: " + std::to_string(rate / 1e9).substr(0, 6);
    }
    benchmark::AddCustomContext("copy_bandwidth_GBps:" + d.str(), copies);
    benchmark::AddCustomContext("gemm_GFLOPs:" + d.str(),
                                std::to_string(l.gemm_flops_per_second / 1e9));
    if (d.is_cpu()) benchmark::AddCustomContext("blas_core:cpu", cpu::blas_core());
    std::cerr << d.str() << " (" << device_name(d) << "): copy GB/s by footprint {" << copies
              << "}, large GEMM " << l.gemm_flops_per_second / 1e9 << " GFLOP/s\n";
  }
  if (cuda_device_count() == 0) {
    benchmark::AddCustomContext("cuda", "not measured: " + cuda_unavailable_reason());
  }
  bench::register_kernel_benchmarks();
  bench::register_mnist_benchmarks();
  bench::register_offload_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
