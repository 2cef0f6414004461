// cuda_backend(): the CUDA half of backend_for() in kernels/backend.cpp. The backend holds no
// state of its own; each call finds its device's stream from the tensors it is given (a tensor
// on a missing device cannot exist: its allocation already failed). prepare_cuda_backend(): the
// half of prepare_backend(), which makes the device's kernel context before the first kernel.
#include "kernels/cuda/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda_seam.h"

namespace accrue {

Backend& cuda_backend(int) {
  static cuda::CudaBackend backend;
  return backend;
}

void prepare_cuda_backend(int device_index) {
  cuda::context(device_index);
}

}  // namespace accrue
