// Where a tensor's memory lives: the host ("cpu") or one CUDA GPU ("cuda:N"). Devices are plain
// values; the per-device allocator and backend are looked up from them (allocator.h,
// kernels/backend.h). Read next: error.h.
#pragma once

#include <cstddef>
#include <string>

namespace accrue {

enum class DeviceType { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  // Parses "cpu", "cuda" or "cuda:N"; throws std::invalid_argument naming the text otherwise.
  static Device parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// True when this build has the CUDA backend compiled in.
bool cuda_built();
// Number of usable CUDA devices: 0 in a CPU-only build, and 0 when the driver reports any error
// (no driver, driver too old, no device).
int cuda_device_count();
// Why cuda_device_count() is zero, in words ("" when it is not).
std::string cuda_unavailable_reason();
// Waits until every operation queued on the device has finished (no-op for the CPU). For timing.
void synchronize(Device device);
// The device's name: the CPU model from /proc/cpuinfo, or the GPU's from the driver.
std::string device_name(Device device);
// What the driver says of a GPU's memory (cudaMemGetInfo): bytes in use by every process and
// context on it, and its total; {0, 0} for the CPU.
struct DeviceMemory {
  size_t used = 0, total = 0;
};
DeviceMemory device_memory(Device device);

}  // namespace accrue
