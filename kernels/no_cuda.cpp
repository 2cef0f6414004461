// The kernels' CUDA entry points in a build without CUDA: asking for a CUDA backend or the
// profiler's CUDA marks throws, saying why, and a GPU cannot convolve for the same reason. A CUDA
// build compiles kernels/cuda/ instead.
#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda_seam.h"
#include "kernels/profile.h"

namespace accrue {

Backend& cuda_backend(int) {
  throw DeviceError("[cuda] " + cuda_unavailable_reason());
}

void prepare_cuda_backend(int) {
  throw DeviceError("[cuda] " + cuda_unavailable_reason());
}

std::string cuda_conv_unavailable_reason() {
  return cuda_unavailable_reason();
}

std::unique_ptr<DeviceMarks> make_cuda_marks(int) {
  throw DeviceError("[profile] " + cuda_unavailable_reason());
}

}  // namespace accrue
