// CUDA events as the profiler's device marks (DeviceMarks, kernels/profile.h): each mark is an
// event recorded on the device's stream, after everything queued there so far (every kernel, copy
// and library call of the device runs on that stream, core/cuda/runtime.h). Events are kept for
// reuse and destroyed with the marks.
#include <mutex>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "kernels/cuda_seam.h"
#include "kernels/profile.h"

namespace accrue {

namespace {

class CudaMarks final : public DeviceMarks {
 public:
  explicit CudaMarks(int device) : device_(device) {}
  ~CudaMarks() override {
    // At exit the runtime may be gone already; the events go with it then.
    for (cudaEvent_t e : created_) (void)cudaEventDestroy(e);
  }

  Mark record() override {
    const cuda::DeviceRuntime& rt = cuda::runtime(device_);  // makes the device current
    cudaEvent_t event = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (free_.empty()) {
        ACCRUE_CUDA_CHECK(cudaEventCreate(&event));  // on the current device, timing enabled
        created_.push_back(event);
      } else {
        event = free_.back();
        free_.pop_back();
      }
    }
    ACCRUE_CUDA_CHECK(cudaEventRecord(event, rt.stream));
    return event;
  }

  bool reached(Mark mark) override {
    return ACCRUE_CUDA_QUERY(cudaEventQuery(static_cast<cudaEvent_t>(mark)));
  }

  double seconds_between(Mark start, Mark stop) override {
    ACCRUE_CUDA_WAIT(cudaEventSynchronize(static_cast<cudaEvent_t>(stop)));
    float ms = 0;
    ACCRUE_CUDA_CHECK(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)));
    return static_cast<double>(ms) * 1e-3;
  }

  void release(Mark mark) override {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(static_cast<cudaEvent_t>(mark));
  }

 private:
  int device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> created_, free_;
};

}  // namespace

std::unique_ptr<DeviceMarks> make_cuda_marks(int device_index) {
  cuda::runtime(device_index);  // throws DeviceError for a device that is not present
  return std::make_unique<CudaMarks>(device_index);
}

}  // namespace accrue
