// The seam between the base layer and the CUDA runtime: device memory, pinned host memory and
// byte copies, declared once. A CUDA build defines these in core/cuda/runtime.cu; a build without
// CUDA defines them in core/no_cuda.cpp, where each one throws DeviceError. Both include this
// header, so a definition that drifts from it is a compile error. The device queries
// (cuda_built, cuda_device_count, ...) are public and live in core/device.h; this header is for
// accrue's own files. Kernels, streams' other users and library handles are in kernels/cuda/.
#pragma once

#include <cstddef>
#include <string>

#include "core/allocator.h"
#include "core/device.h"

namespace accrue {

// cudaMalloc / cudaFree behind a device's caching allocator.
SystemMemory cuda_system_memory();
// cudaHostAlloc / cudaFreeHost behind pinned_host_allocator().
SystemMemory cuda_pinned_host_memory();
// Copies between host and device memory or between two devices, ordered after the work queued
// on both devices' streams; returns when the bytes have arrived. Within one device the copy is
// only enqueued on its stream.
void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t nbytes);
// Zeroes nbytes of device memory, enqueued on the device's stream.
void cuda_zero_bytes(void* dst, Device device, size_t nbytes);

// The CPU model from /proc/cpuinfo (core/device.cpp), for device_name().
std::string cpu_model_name();

}  // namespace accrue
