// The same-run limits: memory bandwidth at each footprint (on the CPU the best of memcpy, a copy
// loop, STREAM's triad, an in-place update, an in-place axpy and a read-only sum, on one thread
// and on all; a device-to-device copy on a GPU) and a large float32 GEMM, measured before the
// benchmarks, best of several repeats.
#include <cblas.h>
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

// Kernels that stream a footprint of bytes through the CPU's caches and memory, on one thread
// and split across the OpenMP threads accrue's loops use. memcpy alone is no limit: glibc
// switches to non-temporal stores for large copies, which a loop that reads and writes the same
// lines beats (element-wise kernels measured up to 2.7x "copy bandwidth" against it). The limit
// at a footprint is the best of all of them, in bytes moved per second.
namespace {

// memcpy on t threads, each copying its own contiguous share. Moves 2 x n doubles.
void memcpy_kernel(int t, const double* src, double* dst, int64_t n) {
#pragma omp parallel num_threads(t)
  {
    const int64_t parts = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t begin = n * me / parts, end = n * (me + 1) / parts;
    std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin) * sizeof(double));
  }
}

// dst = src, a plain loop. Moves 2 x n doubles.
void copy_kernel(int t, const double* src, double* dst, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(t)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// a = b + 3 c (STREAM's triad). Moves 3 x n doubles.
void triad_kernel(int t, double* a, const double* b, const double* c, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(t)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0 * c[i];
}

// x = 0.5 x + 1 in place: a read and a write of the same lines, as the fused optimizer passes
// do (no read-for-ownership of a separate destination). Moves 2 x n doubles.
void update_kernel(int t, double* x, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(t)
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5 * x[i] + 1.0;
}

// x += 0.5 y in place: two reads and a write, the accumulation's own pattern. Moves 3 x n.
void axpy_kernel(int t, double* x, const double* y, int64_t n) {
#pragma omp parallel for simd schedule(static) num_threads(t)
  for (int64_t i = 0; i < n; ++i) x[i] += 0.5 * y[i];
}

// The sum of x, read only. Moves n doubles.
double sum_kernel(int t, const double* x, int64_t n) {
  double total = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : total) num_threads(t)
  for (int64_t i = 0; i < n; ++i) total += x[i];
  return total;
}

}  // namespace

// The best bandwidth of the kernels above at this footprint (a device-to-device copy on a GPU).
double copy_bandwidth(Device device, int64_t footprint) {
  const int repeats =
      static_cast<int>(std::clamp<int64_t>((int64_t(1) << 32) / footprint, 15, 400));
  if (!device.is_cpu()) {
    const int64_t bytes = footprint / 2;
    Tensor src = Tensor::zeros({bytes / 4}, DType::kFloat32, device);
    Tensor dst = Tensor::zeros({bytes / 4}, DType::kFloat32, device);
    return 2.0 * double(bytes) / best_seconds(device, repeats, [&] { dst.copy_(src); });
  }
  const int64_t n = footprint / 8;  // doubles in the footprint
  Tensor buffer = full({n}, 1.0, DType::kFloat64);
  double* x = static_cast<double*>(buffer.raw());
  const double bytes = double(n) * 8;  // each kernel below moves the footprint once or more
  const auto rate = [&](double moved, auto kernel) {
    return moved / best_seconds(device, repeats, kernel);
  };
  volatile double sink = 0;
  double best = 0;
  // On one thread too: accrue runs small loops on the calling thread, where a fork would cost
  // more than the loop.
  for (int t : {1, omp_get_max_threads()}) {
    const int64_t half = n / 2, third = n / 3;
    best = std::max({best, rate(bytes, [&] { memcpy_kernel(t, x, x + half, half); }),
                     rate(bytes, [&] { copy_kernel(t, x, x + half, half); }),
                     rate(bytes, [&] { triad_kernel(t, x, x + third, x + 2 * third, third); }),
                     rate(2 * bytes, [&] { update_kernel(t, x, n); }),
                     rate(1.5 * bytes, [&] { axpy_kernel(t, x, x + half, half); }),
                     rate(bytes, [&] { sink = sum_kernel(t, x, n); })});
  }
  (void)sink;
  return best;
}

Limits measure_limits(Device device) {
  Limits l;
  const int64_t largest =
      smoke() ? (int64_t(1) << 21) : (device.is_cpu() ? (int64_t(1) << 29) : (int64_t(1) << 32));
  // Steps of 2: at a cache level's edge the limit moves a lot between neighbouring footprints.
  for (int64_t footprint = int64_t(1) << 16; footprint <= largest; footprint *= 2) {
    l.copy_bytes_per_second[footprint] = copy_bandwidth(device, footprint);
  }
  const int64_t n = smoke() ? 256 : (device.is_cpu() ? 2048 : 8192);
  Tensor a = filled({n, n}, device, 1), b = filled({n, n}, device, 2);
  Tensor c = Tensor::zeros({n, n}, DType::kFloat32, device);
  Backend& be = backend_for(device);
  double gemm = best_seconds(device, 15, [&] { be.gemm(false, false, 1.0, a, b, 0.0, c); });
  if (device.is_cpu()) {
    // The BLAS library's own threading may beat accrue's fixed cut at this size; the limit is
    // whichever is faster, so it never flatters accrue.
    const int ni = static_cast<int>(n);
    gemm =
        std::min(gemm, best_seconds(device, 15, [&] {
                   cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f,
                               a.data<float>(), ni, b.data<float>(), ni, 0.0f, c.data<float>(), ni);
                 }));
  }
  l.gemm_flops_per_second = 2.0 * double(n) * double(n) * double(n) / gemm;
  return l;
}

}  // namespace accrue::bench
