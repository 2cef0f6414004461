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

Backend& traced(Device device) {
  constexpr int kSlots = 17;  // cpu and cuda:0 .. cuda:15
  static std::unique_ptr<Backend> tracers[kSlots];
  static std::mutex mutex;
  Backend& inner = untraced(device);  // throws for a device that does not exist
  const int slot = device.is_cpu() ? 0 : 1 + device.index;
  if (slot >= kSlots) throw DeviceError(str_cat("[trace] cannot trace ", device.str()));
  std::lock_guard<std::mutex> lock(mutex);
  if (!tracers[slot]) tracers[slot] = make_tracing_backend(inner, std::cerr);
  return *tracers[slot];
}

Backend& profiled(Device device) {
  constexpr int kSlots = 17;  // cpu and cuda:0 .. cuda:15
  static std::unique_ptr<Backend> profilers[kSlots];
  static std::mutex mutex;
  Backend& inner = trace_enabled() ? traced(device) : untraced(device);
  const int slot = device.is_cpu() ? 0 : 1 + device.index;
  if (slot >= kSlots) throw DeviceError(str_cat("[profile] cannot profile ", device.str()));
  std::lock_guard<std::mutex> lock(mutex);
  if (!profilers[slot]) profilers[slot] = make_profiling_backend(inner, device);
  return *profilers[slot];
}

}  // namespace

Backend& backend_for(Device device) {
  if (profile_enabled()) return profiled(device);
  return trace_enabled() ? traced(device) : untraced(device);
}

std::string conv_unavailable_reason(Device device) {
  return device.is_cuda() ? cuda_conv_unavailable_reason() : std::string();
}

}  // namespace accrue
