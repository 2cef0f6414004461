// backend_for: the one place that maps a device to its backend (wrapped in the tracing
// decorator of kernels/trace.h when ACCRUE_TRACE=1, and that in the profiling one of
// kernels/profile.h when ACCRUE_PROFILE=1); conv_unavailable_reason, which asks the
// CUDA half whether it has cuDNN.
#include "kernels/backend.h"

#include <iostream>
#include <memory>
#include <mutex>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda_seam.h"
#include "kernels/profile.h"
#include "kernels/trace.h"

namespace accrue {

namespace {

Backend& untraced(Device device) {
  if (device.is_cpu()) {
    static cpu::CpuBackend cpu_backend;
    return cpu_backend;
  }
  return cuda_backend(device.index);
}

// One decorator per device (cpu, cuda:0 .. cuda:15), made around the inner backend on first use.
class Decorators {
 public:
  explicit Decorators(const char* verb) : verb_(verb) {}
  template <typename Make>
  Backend& get(Device device, Backend& inner, Make make) {
    const int slot = device.is_cpu() ? 0 : 1 + device.index;
    if (slot >= kSlots)
      throw DeviceError(str_cat("[", verb_, "] cannot ", verb_, " ", device.str()));
    std::lock_guard<std::mutex> lock(mutex_);
    if (!slots_[slot]) slots_[slot] = make(inner);
    return *slots_[slot];
  }

 private:
  static constexpr int kSlots = 17;
  const char* verb_;
  std::mutex mutex_;
  std::unique_ptr<Backend> slots_[kSlots];
};

Backend& traced(Device device) {
  static Decorators tracers("trace");
  Backend& inner = untraced(device);  // throws for a device that does not exist
  return tracers.get(device, inner, [](Backend& b) { return make_tracing_backend(b, std::cerr); });
}

Backend& profiled(Device device) {
  static Decorators profilers("profile");
  Backend& inner = trace_enabled() ? traced(device) : untraced(device);
  return profilers.get(device, inner,
                       [device](Backend& b) { return make_profiling_backend(b, device); });
}

}  // namespace

Backend& backend_for(Device device) {
  if (profile_enabled()) return profiled(device);
  return trace_enabled() ? traced(device) : untraced(device);
}

void prepare_backend(Device device) {
  if (device.is_cuda()) prepare_cuda_backend(device.index);
}

std::string conv_unavailable_reason(Device device) {
  return device.is_cuda() ? cuda_conv_unavailable_reason() : std::string();
}

}  // namespace accrue
