// The seam between core/ and the CUDA build: everything the CUDA backend (kernels/cuda/)
// provides to the rest of accrue, declared once. A CUDA build defines these in kernels/cuda/;
// a build without CUDA defines them in core/no_cuda.cpp, where each one throws DeviceError or
// answers "no devices". Both include this header, so a definition that drifts from it is a
// compile error. The device queries (cuda_built, cuda_device_count, ...) are public and live in
// core/device.h; this header is for accrue's own files.
#pragma once

#include <cstddef>
#include <string>

#include "core/allocator.h"
#include "core/device.h"

namespace accrue {

class Backend;

// The CUDA backend of one device (kernels/cuda/backend.cu); backend_for() calls it.
Backend& cuda_backend(int device_index);
// cudaMalloc / cudaFree behind a device's caching allocator (kernels/cuda/runtime.cu).
SystemMemory cuda_system_memory();
// cudaHostAlloc / cudaFreeHost behind pinned_host_allocator() (kernels/cuda/runtime.cu).
SystemMemory cuda_pinned_host_memory();
// Copies between host and device memory or between two devices, ordered after the work queued
// on both devices' streams; returns when the bytes have arrived.
void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t nbytes);

// The offloaded optimizer's asynchronous transfers (kernels/cuda/runtime.cu), between a device
// and pinned host memory. cuda_copy_to_host_async enqueues a device -> host copy on the device's
// copy stream, after the work queued so far on its compute stream, and returns at once (the
// gradient, bucket by bucket, while backward goes on); cuda_wait_copies_to_host waits for all of
// them and for the compute stream, and with report_faults throws what the device's kernels found
// wrong (without, a fault stays recorded for the next host read). cuda_copy_from_host_async
// enqueues a host -> device copy on the compute stream and returns at once: the host bytes must
// not change before the stream has passed it (the next cuda_wait_copies_to_host or synchronize).
void cuda_copy_to_host_async(void* dst, const void* src, Device src_device, size_t nbytes);
void cuda_wait_copies_to_host(Device device, bool report_faults);
void cuda_copy_from_host_async(void* dst, Device dst_device, const void* src, size_t nbytes);

// The CPU model from /proc/cpuinfo (core/device.cpp), for device_name().
std::string cpu_model_name();

}  // namespace accrue
