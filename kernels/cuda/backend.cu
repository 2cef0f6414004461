// cuda_backend(): the CUDA half of backend_for() in kernels/backend.cpp. The backend holds no
// state of its own; each call finds its device's stream from the tensors it is given (a tensor
// on a missing device cannot exist: its allocation already failed).
#include "kernels/cuda_seam.h"
#include "kernels/cuda/cuda_backend.h"

namespace accrue {

Backend& cuda_backend(int) {
  static cuda::CudaBackend backend;
  return backend;
}

}  // namespace accrue
