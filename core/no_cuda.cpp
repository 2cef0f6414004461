// The CUDA runtime entry points of a build without CUDA (ACCRUE_CUDA=OFF or no nvcc): no
// devices, and a clear error for anyone who asks for one. A CUDA build compiles
// core/cuda/runtime.cu instead.
#include "core/allocator.h"
#include "core/cuda_seam.h"
#include "core/device.h"
#include "core/error.h"

namespace accrue {

bool cuda_built() {
  return false;
}
int cuda_device_count() {
  return 0;
}
std::string cuda_unavailable_reason() {
  return "accrue was built without CUDA (configure with -DACCRUE_CUDA=ON and a CUDA toolkit)";
}
void synchronize(Device device) {
  if (device.is_cuda()) throw DeviceError("[synchronize] " + cuda_unavailable_reason());
}
std::string device_name(Device device) {
  if (device.is_cuda()) throw DeviceError("[device_name] " + cuda_unavailable_reason());
  return cpu_model_name();
}
DeviceMemory device_memory(Device device) {
  if (device.is_cuda()) throw DeviceError("[device_memory] " + cuda_unavailable_reason());
  return {};
}
SystemMemory cuda_system_memory() {
  throw DeviceError("[cuda] " + cuda_unavailable_reason());
}

void cuda_copy_bytes(void*, Device, const void*, Device, size_t) {
  throw DeviceError("[copy] " + cuda_unavailable_reason());
}
SystemMemory cuda_pinned_host_memory() {
  throw DeviceError("[pinned memory] " + cuda_unavailable_reason());
}
void cuda_zero_bytes(void*, Device, size_t) {
  throw DeviceError("[zero_] " + cuda_unavailable_reason());
}

void* cuda_copy_to_device_async(void*, Device, const void*, size_t) {
  throw DeviceError("[stage] " + cuda_unavailable_reason());
}
void cuda_wait_copy(void*, Device) {
  throw DeviceError("[stage] " + cuda_unavailable_reason());
}
void cuda_release_copy(void*) {}
void cuda_wait_copies(Device) {}
void cuda_begin_capture(Device) {
  throw DeviceError("[graph] " + cuda_unavailable_reason());
}
void* cuda_end_capture(Device, size_t&) {
  throw DeviceError("[graph] " + cuda_unavailable_reason());
}
void cuda_abort_capture(Device) {}
void cuda_launch_graph(void*, Device) {
  throw DeviceError("[graph] " + cuda_unavailable_reason());
}
void cuda_destroy_graph(void*) {}
bool cuda_capturing(Device) {
  return false;
}

}  // namespace accrue
