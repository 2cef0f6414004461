// The same-run limits: copy bandwidth (an all-core memcpy on the CPU, a device-to-device copy on
// a GPU) and a large float32 GEMM, measured before the benchmarks, best of several repeats.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "common.h"
#include "kernels/backend.h"

namespace accrue::bench {

std::map<std::string, Limits>& limits() {
  static std::map<std::string, Limits> l;
  return l;
}

bool& smoke() {
  static bool s = false;
  return s;
}

std::vector<Device> bench_devices() {
  std::vector<Device> out{Device::cpu()};
  if (cuda_device_count() > 0) out.push_back(Device::cuda(0));
  return out;
}

double Limits::copy_at(double footprint) const {
  double best = 0, best_distance = 1e300;
  for (const auto& [bytes, rate] : copy_bytes_per_second) {
    const double distance = std::abs(std::log(double(bytes) / std::max(footprint, 1.0)));
    if (distance < best_distance) best = rate, best_distance = distance;
  }
  return best;
}

namespace {

template <typename F>
double best_seconds(Device device, int repeats, F body) {
  double best = 1e30;
  body();  // warm-up
  synchronize(device);
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    synchronize(device);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

// One copy of footprint/2 bytes into another footprint/2 bytes, best of several repeats.
double copy_bandwidth(Device device, int64_t footprint) {
  const int64_t bytes = footprint / 2;
  Tensor src = Tensor::zeros({bytes / 4}, DType::kFloat32, device);
  Tensor dst = Tensor::zeros({bytes / 4}, DType::kFloat32, device);
  const int repeats = static_cast<int>(std::clamp<int64_t>((int64_t(1) << 32) / footprint, 15, 400));
  const double seconds = best_seconds(device, repeats, [&] {
    if (device.is_cpu()) {
      // memcpy on every core: each thread copies its own contiguous share.
      const char* s = static_cast<const char*>(src.raw());
      char* d = static_cast<char*>(dst.raw());
#pragma omp parallel
      {
        const int64_t parts = omp_get_num_threads(), me = omp_get_thread_num();
        const int64_t begin = bytes * me / parts, end = bytes * (me + 1) / parts;
        std::memcpy(d + begin, s + begin, static_cast<size_t>(end - begin));
      }
    } else {
      dst.copy_(src);
    }
  });
  return 2.0 * double(bytes) / seconds;
}

Limits measure_limits(Device device) {
  Limits l;
  const int64_t largest =
      smoke() ? (int64_t(1) << 21) : (device.is_cpu() ? (int64_t(1) << 29) : (int64_t(1) << 32));
  for (int64_t footprint = int64_t(1) << 16; footprint <= largest; footprint *= 4) {
    l.copy_bytes_per_second[footprint] = copy_bandwidth(device, footprint);
  }
  const int64_t n = smoke() ? 256 : (device.is_cpu() ? 2048 : 8192);
  Tensor a = filled({n, n}, device, 1), b = filled({n, n}, device, 2);
  Tensor c = Tensor::zeros({n, n}, DType::kFloat32, device);
  Backend& be = backend_for(device);
  const double gemm = best_seconds(device, 15, [&] { be.gemm(false, false, 1.0, a, b, 0.0, c); });
  l.gemm_flops_per_second = 2.0 * double(n) * double(n) * double(n) / gemm;
  return l;
}

}  // namespace accrue::bench
