// accrue-bench-report: turns accrue-bench's Google Benchmark JSON into a readable Markdown
// table with the machine described and the targets checked against the measured
// figures. Usage: accrue-bench-report RESULTS.json > RESULTS.md
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

using nlohmann::json;

namespace {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "adam/cuda:0/16777216/real_time" -> {"adam", "cuda:0", "16777216"}
std::vector<std::string> split(const std::string& name) {
  std::vector<std::string> parts;
  std::stringstream in(name);
  std::string p;
  while (std::getline(in, p, '/')) parts.push_back(p);
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: accrue-bench-report RESULTS.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << "accrue-bench-report: cannot open " << argv[1] << "\n";
    return 1;
  }
  const json doc = json::parse(in);
  const json& ctx = doc["context"];
  std::cout << "# accrue benchmarks\n\n";
  std::cout << "Produced by `bench/run` on " << ctx.value("date", "?") << " (host "
            << ctx.value("host_name", "?") << ", " << ctx.value("num_cpus", 0) << " CPUs at "
            << ctx.value("mhz_per_cpu", 0)
            << " MHz; accrue built Release, Google Benchmark library "
            << ctx.value("library_build_type", "?") << ").\n\n";
  std::cout
      << "| device | name | same-run memory bandwidth | same-run large GEMM |\n|---|---|---|---|\n";
  for (auto it = ctx.begin(); it != ctx.end(); ++it) {
    if (it.key().rfind("device:", 0) != 0) continue;
    const std::string dev = it.key().substr(7);
    std::cout << "| " << dev << " | " << it.value().get<std::string>() << " | "
              << ctx.value("copy_bandwidth_GBps:" + dev, "?") << " GB/s | "
              << ctx.value("gemm_GFLOPs:" + dev, "?") << " GFLOP/s |\n";
  }
  if (ctx.contains("blas_core:cpu")) {
    std::cout << "\nOpenBLAS kernels on the CPU: " << ctx["blas_core:cpu"].get<std::string>()
              << " (the GEMM rate depends on them: AVX2 or AVX-512).\n";
  }
  if (ctx.contains("bf16_products:cpu")) {
    std::cout << "bfloat16 products on the CPU: " << ctx["bf16_products:cpu"].get<std::string>()
              << " (kernels/cpu/bf16_products.h).\n";
  }
  if (ctx.contains("cuda")) std::cout << "\nCUDA: " << ctx["cuda"].get<std::string>() << "\n";
  std::cout
      << "\n`roofline` is the fraction of the same-run memory bandwidth (bandwidth-bound "
         "kernels, counting the bytes each must read and write) or of the same-run large "
         "GEMM (GEMMs). The bandwidth is the best of six streaming kernels on the CPU (memcpy, "
         "a copy loop, triad, an in-place update, an in-place axpy, a read-only sum; one thread "
         "and all) or a device-to-device copy on a GPU, measured at the footprint nearest to "
         "the kernel's (listed above by footprint), so a kernel running from cache is compared "
         "with kernels running from cache. Timings are wall clock per iteration, waiting for the "
         "device.\n\n";
  bool has_aggregates = false;
  int repetitions = 1;
  for (const json& b : doc["benchmarks"]) {
    if (b.value("run_type", "") != "aggregate") continue;
    has_aggregates = true;
    repetitions = b.value("repetitions", repetitions);
  }
  if (has_aggregates) {
    std::cout << "Each row is the median of " << repetitions << " repetitions "
              << "(`--benchmark_repetitions`): memory bandwidth varies between runs on a shared "
                 "machine.\n\n";
  }
  std::cout << "| benchmark | time | GB/s | GFLOP/s | samples/s | roofline "
               "|\n|---|---|---|---|---|---|\n";
  std::map<std::string, double> adam_roof, adam_time, boundary_time;
  // Mixed precision: "gemm_forward cpu 32/784/512" -> {float32 FLOP/s, bfloat16 FLOP/s}; the
  // Adam pass that writes the bfloat16 working copy, by "cpu 567434" -> fraction of copy.
  std::map<std::string, std::pair<double, double>> gemm_rates;
  std::map<std::string, double> adam_copy_roof;
  std::map<std::string, int64_t> largest;
  for (const json& b : doc["benchmarks"]) {
    // With --benchmark_repetitions, report the median of the repetitions.
    if (has_aggregates && b.value("aggregate_name", "") != "median") continue;
    const std::string name = b.value("run_name", b["name"].get<std::string>());
    std::cout << "| " << name << " | " << fixed(b["real_time"].get<double>(), 3) << " "
              << b.value("time_unit", "") << " | "
              << (b.contains("bytes_per_second")
                      ? fixed(b["bytes_per_second"].get<double>() / 1e9, 2)
                      : "")
              << " | " << (b.contains("FLOP/s") ? fixed(b["FLOP/s"].get<double>() / 1e9, 1) : "")
              << " | " << (b.contains("samples/s") ? fixed(b["samples/s"].get<double>(), 0) : "")
              << " | " << (b.contains("roofline") ? fixed(b["roofline"].get<double>(), 3) : "")
              << " |\n";
    const auto parts = split(name);
    if (parts.size() < 3) continue;
    if (parts[0].rfind("gemm_", 0) == 0 && b.contains("FLOP/s")) {
      const bool bf16 = parts[0].size() > 5 && parts[0].substr(parts[0].size() - 5) == "_bf16";
      std::string shape;
      for (size_t i = 2; i < parts.size() && parts[i].find("time") == std::string::npos; ++i) {
        shape += (shape.empty() ? "" : "x") + parts[i];
      }
      const std::string key = (bf16 ? parts[0].substr(0, parts[0].size() - 5) : parts[0]) + " " +
                              parts[1] + " " + shape;
      (bf16 ? gemm_rates[key].second : gemm_rates[key].first) = b["FLOP/s"].get<double>();
    }
    if (parts[0] == "adam_bf16_copy" && b.contains("roofline")) {
      adam_copy_roof[parts[1] + " " + parts[2]] = b["roofline"].get<double>();
    }
    const std::string& dev = parts[1];
    int64_t size = 0;
    try {
      size = std::stoll(parts[2]);
    } catch (...) {
      continue;
    }
    if (parts[0] == "adam" && size >= largest[dev]) {
      largest[dev] = size;
      adam_roof[dev] = b["roofline"].get<double>();
      adam_time[dev] = b["real_time"].get<double>();
    }
    if (parts[0] == "boundary_step" && size == largest[dev])
      boundary_time[dev] = b["real_time"].get<double>();
  }
  std::cout << "\n## Targets\n\n| device | fused Adam at "
            << "the largest size: fraction of copy | boundary step / Adam |\n|---|---|---|\n";
  for (const auto& [dev, roof] : adam_roof) {
    std::cout << "| " << dev << " (" << largest[dev] << " params) | " << fixed(roof, 3)
              << " (target " << (dev == "cpu" ? "0.70 on 2 CPU cores" : "0.90 on H100/H200")
              << ") | "
              << (boundary_time.count(dev) ? fixed(boundary_time[dev] / adam_time[dev], 3) : "?")
              << (dev == "cpu" ? "" : " (target <= 1.25)") << " |\n";
  }
  std::cout
      << "\n## Mixed precision\n\nbfloat16 GEMMs (float32 accumulation; the weight "
         "gradient into a float32 C) against the float32 GEMM of the same shape, same run:\n\n"
         "| GEMM | device | shape | float32 GFLOP/s | bfloat16 GFLOP/s | bf16 / fp32 "
         "|\n|---|---|---|---|---|---|\n";
  for (const auto& [key, rates] : gemm_rates) {
    if (rates.first <= 0 || rates.second <= 0) continue;
    std::stringstream k(key);
    std::string gemm, dev, shape;
    k >> gemm >> dev >> shape;
    std::cout << "| " << gemm << " | " << dev << " | " << shape << " | "
              << fixed(rates.first / 1e9, 1) << " | " << fixed(rates.second / 1e9, 1) << " | "
              << fixed(rates.second / rates.first, 2) << " |\n";
  }
  std::cout << "\nThe fused Adam pass that also writes the bfloat16 working copy (34 bytes per "
               "parameter), as a fraction of the same-run copy bandwidth:\n\n| device, "
               "parameters | fraction of copy |\n|---|---|\n";
  for (const auto& [key, roof] : adam_copy_roof) {
    std::cout << "| " << key << " | " << fixed(roof, 3) << " |\n";
  }
  return 0;
}
