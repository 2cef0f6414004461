// The kernels' CUDA entry point in a build without CUDA: asking for a CUDA backend throws,
// saying why. A CUDA build compiles kernels/cuda/ instead.
#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda_seam.h"

namespace accrue {

Backend& cuda_backend(int) {
  throw DeviceError("[cuda] " + cuda_unavailable_reason());
}

}  // namespace accrue
