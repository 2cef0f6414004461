// The offloaded optimizer's transfers on a GPU (see optim/offload_copies.h): a copy stream per
// device beside the compute stream, so the copy engine moves finished gradients while the
// compute stream runs backward on, and the event that orders each copy after the compute
// stream's work.
#include <memory>
#include <mutex>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "optim/offload_copies.h"

namespace accrue::optim {

namespace {

struct CopyStream {
  cudaStream_t compute = nullptr;  // the runtime's
  cudaStream_t copy = nullptr;
  cudaEvent_t ready = nullptr;
};

// Makes the device current and returns its copy stream, created on first use.
CopyStream& copy_stream(int device) {
  constexpr int kMaxDevices = 16;
  static std::unique_ptr<CopyStream> streams[kMaxDevices];
  static std::mutex mutex;
  cuda::DeviceRuntime& rt = cuda::runtime(device);  // checks the device
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = streams[device];
  if (!slot) {
    auto s = std::make_unique<CopyStream>();
    s->compute = rt.stream;
    ACCRUE_CUDA_CHECK(cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking));
    ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
    slot = std::move(s);
  }
  return *slot;
}

}  // namespace

void copy_to_host_async(void* dst, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  CopyStream& s = copy_stream(src_device.index);
  // The copy stream waits for what the compute stream has queued so far (the kernels that wrote
  // these bytes), not for what it queues later.
  ACCRUE_CUDA_CHECK(cudaEventRecord(s.ready, s.compute));
  ACCRUE_CUDA_CHECK(cudaStreamWaitEvent(s.copy, s.ready, 0));
  ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s.copy));
}

void wait_copies_to_host(Device device, bool report_faults) {
  CopyStream& s = copy_stream(device.index);
  ACCRUE_CUDA_WAIT(cudaStreamSynchronize(s.copy));
  if (!report_faults) {
    ACCRUE_CUDA_WAIT(cudaStreamSynchronize(s.compute));
    return;
  }
  // The host reads the gradient now: the kernels that made it report their faults first.
  synchronize(device);
}

void copy_from_host_async(void* dst, Device dst_device, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  const CopyStream& s = copy_stream(dst_device.index);
  ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s.compute));
}

}  // namespace accrue::optim
