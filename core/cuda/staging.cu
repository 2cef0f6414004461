// The copy stream of core/staging.h: per GPU one non-blocking stream for host-to-device copies of
// staged micro-batches, and a pool of events that order them against the compute stream. No call
// here waits for the device: an event is recorded and waited for by streams, never by the host.
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/cuda_seam.h"

namespace accrue {

namespace {

struct CopyLane {
  cudaStream_t copy = nullptr;
  cudaEvent_t queued = nullptr;  // re-recorded on the compute stream before each copy
  // Completion events of this device's copies, reused: a stream's wait on an event takes the
  // event's state at that call, so an event may be recorded again once every wait on it has been
  // queued. (An event is recorded on a stream of its own device only.)
  std::vector<cudaEvent_t> free_events;
};

struct Copied {
  cudaEvent_t event;
  int device;
};

std::mutex lanes_mutex;

CopyLane& lane(int device) {
  static std::unique_ptr<CopyLane> lanes[16];
  cuda::runtime(device);  // checks the device and makes it current
  std::lock_guard<std::mutex> lock(lanes_mutex);
  auto& slot = lanes[device];
  if (!slot) {
    auto l = std::make_unique<CopyLane>();
    ACCRUE_CUDA_CHECK(cudaStreamCreateWithFlags(&l->copy, cudaStreamNonBlocking));
    ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&l->queued, cudaEventDisableTiming));
    slot = std::move(l);
  }
  return *slot;
}

cudaEvent_t take_event(CopyLane& l) {
  {
    std::lock_guard<std::mutex> lock(lanes_mutex);
    if (!l.free_events.empty()) {
      cudaEvent_t e = l.free_events.back();
      l.free_events.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

}  // namespace

void* cuda_copy_to_device_async(void* dst, Device device, const void* pinned_src, size_t nbytes) {
  if (nbytes == 0) return nullptr;
  CopyLane& l = lane(device.index);
  cudaStream_t compute = cuda::runtime(device.index).stream;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  ACCRUE_CUDA_CHECK(cudaStreamIsCapturing(compute, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) {
    // The event below would pull the copy stream into the capture.
    throw NotCapturable("[stage] a host-to-device copy cannot be staged inside a CUDA graph");
  }
  // The destination block may have been freed by work the compute stream has not run yet.
  ACCRUE_CUDA_CHECK(cudaEventRecord(l.queued, compute));
  ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(l.copy, l.queued, 0));
  ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst, pinned_src, nbytes, cudaMemcpyHostToDevice, l.copy));
  auto copied = std::make_unique<Copied>(Copied{take_event(l), device.index});
  ACCRUE_CUDA_CHECK(cudaEventRecord(copied->event, l.copy));
  return copied.release();
}

void cuda_wait_copy(void* copied, Device device) {
  if (copied == nullptr) return;
  cudaStream_t compute = cuda::runtime(device.index).stream;
  ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(compute, static_cast<Copied*>(copied)->event, 0));
  cuda_release_copy(copied);
}

void cuda_release_copy(void* copied) {
  if (copied == nullptr) return;
  std::unique_ptr<Copied> c(static_cast<Copied*>(copied));
  CopyLane& l = lane(c->device);
  std::lock_guard<std::mutex> lock(lanes_mutex);
  l.free_events.push_back(c->event);
}

void cuda_wait_copies(Device device) {
  ACCRUE_CUDA_WAIT(cudaStreamSynchronize(lane(device.index).copy));
}

}  // namespace accrue
