// The seam between the kernels layer and its CUDA half: the CUDA backend of a device, defined in
// kernels/cuda/backend.cu by a CUDA build and in kernels/no_cuda.cpp (throwing DeviceError)
// otherwise, and why a GPU cannot convolve (kernels/cuda/conv.cu, or kernels/no_cuda.cpp).
// backend_for() and conv_unavailable_reason() in kernels/backend.cpp are their one callers.
#pragma once

#include <string>

namespace accrue {

class Backend;

Backend& cuda_backend(int device_index);
// "" when this build has cuDNN; otherwise what is missing.
std::string cuda_conv_unavailable_reason();

}  // namespace accrue
