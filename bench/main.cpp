// accrue-bench: Google Benchmark over accrue's kernels and the MNIST MLP on every device
// present. Accepts Google Benchmark's flags, plus --smoke (every benchmark once at its smallest
// size: what CI runs) and --limits (measure and print the machine's limits, run nothing: for
// scripts that need the same-run GEMM rate, bench/g2p-peer.sh). The limits used for `roofline` are
// measured and printed once there is a benchmark to run (not for --benchmark_list_tests or a filter
// that matches none); a
// --benchmark_out file that cannot be written is an error (exit 1).
#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>

#include "common.h"
#include "kernels/cpu/bf16_products.h"
#include "kernels/cpu/blas_core.h"

namespace accrue::bench {
Limits measure_limits(Device device);
void register_kernel_benchmarks();
void register_mnist_benchmarks();
void register_offload_benchmarks();
}  // namespace accrue::bench

namespace accrue::bench {
namespace {

// The machine's limits of every device, measured once, into the context the reporters print.
void measure_every_limit() {
  for (Device d : bench_devices()) {
    const Limits l = measure_limits(d);
    limits()[d.str()] = l;
    benchmark::AddCustomContext("device:" + d.str(), device_name(d));
    std::string copies;
    for (const auto& [bytes, rate] : l.copy_bytes_per_second) {
      copies += (copies.empty() ? "" : ", ") + std::to_string(bytes >> 10) +
                " KiB: " + std::to_string(rate / 1e9).substr(0, 6);
    }
    benchmark::AddCustomContext("copy_bandwidth_GBps:" + d.str(), copies);
    benchmark::AddCustomContext("gemm_GFLOPs:" + d.str(),
                                std::to_string(l.gemm_flops_per_second / 1e9));
    if (d.is_cpu()) {
      benchmark::AddCustomContext("blas_core:cpu", cpu::blas_core());
      benchmark::AddCustomContext("bf16_products:cpu", cpu::bf16_products_library());
    }
    std::cerr << d.str() << " (" << device_name(d) << "): copy GB/s by footprint {" << copies
              << "}, large GEMM " << l.gemm_flops_per_second / 1e9 << " GFLOP/s\n";
  }
  if (cuda_device_count() == 0) {
    benchmark::AddCustomContext("cuda", "not measured: " + cuda_unavailable_reason());
  }
}

// The console reporter, which measures the limits when Google Benchmark reports the context:
// that is, only when some benchmark is about to run.
class MeasuringReporter : public benchmark::ConsoleReporter {
 public:
  bool ReportContext(const Context& context) override {
    measure_every_limit();
    return ConsoleReporter::ReportContext(context);
  }
};

// Google Benchmark marks its CSV reporter deprecated; --benchmark_out_format=csv works for as
// long as the library keeps it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
std::unique_ptr<benchmark::BenchmarkReporter> csv_reporter() {
  return std::make_unique<benchmark::CSVReporter>();
}
#pragma GCC diagnostic pop

// --benchmark_out's reporter (JSON or CSV, as --benchmark_out_format says), which checks at the
// end that its stream took every byte: /dev/full or a full disk is a failed run, not exit 0.
class CheckedFileReporter : public benchmark::BenchmarkReporter {
 public:
  explicit CheckedFileReporter(bool csv) {
    if (csv) {
      inner_ = csv_reporter();
    } else {
      inner_ = std::make_unique<benchmark::JSONReporter>();
    }
  }
  bool ReportContext(const Context& context) override {
    inner_->SetOutputStream(&GetOutputStream());
    inner_->SetErrorStream(&GetErrorStream());
    return inner_->ReportContext(context);
  }
  void ReportRuns(const std::vector<Run>& runs) override { inner_->ReportRuns(runs); }
  void Finalize() override {
    inner_->Finalize();
    failed_ = !GetOutputStream().flush();
  }
  bool failed() const { return failed_; }

 private:
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  bool failed_ = false;
};

// The value of a --benchmark_xxx=value flag in args ("" when absent).
std::string flag_value(const std::vector<char*>& args, const std::string& flag) {
  std::string value;
  for (const char* a : args) {
    if (std::strncmp(a, (flag + "=").c_str(), flag.size() + 1) == 0) value = a + flag.size() + 1;
  }
  return value;
}

}  // namespace
}  // namespace accrue::bench

int main(int argc, char** argv) {
  using namespace accrue;
  cpu::run_with_cpu_blas_kernels(argv);  // rates of the kernels the CPU has, not a fallback's
  std::vector<char*> args;
  bool limits_only = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) {
      bench::smoke() = true;
    } else if (std::strcmp(argv[i], "--limits") == 0) {
      limits_only = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  const std::string out = bench::flag_value(args, "--benchmark_out");
  const std::string out_format = bench::flag_value(args, "--benchmark_out_format");
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 2;
  if (!out.empty() && out_format == "console") {
    std::cerr << "accrue-bench: --benchmark_out_format=console is not supported; json or csv\n";
    return 2;
  }
  if (limits_only) {
    bench::measure_every_limit();  // printed on stderr
    return 0;
  }
  bench::register_kernel_benchmarks();
  bench::register_mnist_benchmarks();
  bench::register_offload_benchmarks();
  bench::MeasuringReporter display;
  std::unique_ptr<bench::CheckedFileReporter> file;
  if (!out.empty()) file = std::make_unique<bench::CheckedFileReporter>(out_format == "csv");
  const size_t ran = benchmark::RunSpecifiedBenchmarks(&display, file.get());
  benchmark::Shutdown();
  if (ran == 0 && bench::flag_value(args, "--benchmark_list_tests").empty() &&
      std::find_if(args.begin(), args.end(), [](const char* a) {
        return std::strcmp(a, "--benchmark_list_tests") == 0;
      }) == args.end()) {
    return 1;  // a filter that matches nothing: said by Google Benchmark
  }
  if (file && file->failed()) {
    std::cerr << "accrue-bench: --benchmark_out=" << out << ": the results could not be written\n";
    return 1;
  }
  return 0;
}
