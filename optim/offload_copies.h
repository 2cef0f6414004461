// The offloaded optimizer's asynchronous transfers between a device and pinned host memory,
// defined in optim/cuda/offload_copies.cu by a CUDA build and in optim/offload_no_cuda.cpp
// (throwing DeviceError) otherwise; optim/offload.cpp is their one caller.
//
// copy_to_host_async enqueues a device -> host copy on the device's copy stream, after the work
// queued so far on its compute stream, and returns at once (the gradient, bucket by bucket,
// while backward goes on); wait_copies_to_host waits for all of them and for the compute
// stream, and with report_faults throws what the device's kernels found wrong (without, a fault
// stays recorded for the next host read). copy_from_host_async enqueues a host -> device copy
// on the compute stream and returns at once: the host bytes must not change before the stream
// has passed it (the next wait_copies_to_host or synchronize).
#pragma once

#include <cstddef>

#include "core/device.h"

namespace accrue::optim {

void copy_to_host_async(void* dst, const void* src, Device src_device, size_t nbytes);
void wait_copies_to_host(Device device, bool report_faults);
void copy_from_host_async(void* dst, Device dst_device, const void* src, size_t nbytes);

}  // namespace accrue::optim
