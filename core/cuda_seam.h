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

// Host-to-device copies that nobody waits for (core/staging.h): queues the copy of nbytes from
// pinned host memory on the device's copy stream, after the work queued so far on its compute
// stream, and returns the copy's completion (an event; nullptr for nbytes == 0).
void* cuda_copy_to_device_async(void* dst, Device device, const void* pinned_src, size_t nbytes);
// The compute stream waits for the copy before its later work; the completion is released.
void cuda_wait_copy(void* copied, Device device);
// Releases a completion nobody will wait for.
void cuda_release_copy(void* copied);
// Waits for every copy queued on the device's copy stream (a host wait).
void cuda_wait_copies(Device device);

// Stream capture for CUDA graphs (core/graph.h), on the device's stream, in relaxed mode: the
// caching allocator may still call cudaMalloc for a block the capture needs.
void cuda_begin_capture(Device device);
// Ends the capture and instantiates the graph (returned: a cudaGraphExec_t) with its node count.
// Throws GraphCaptureError when the runtime invalidated the capture.
void* cuda_end_capture(Device device, size_t& nodes);
// Ends a capture that failed and discards it; never throws.
void cuda_abort_capture(Device device);
void cuda_launch_graph(void* graph, Device device);
void cuda_destroy_graph(void* graph);
bool cuda_capturing(Device device);

// The CPU model from /proc/cpuinfo (core/device.cpp), for device_name().
std::string cpu_model_name();

}  // namespace accrue
