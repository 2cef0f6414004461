// The seam between the kernels layer and its CUDA half: the CUDA backend of a device, defined in
// kernels/cuda/backend.cu by a CUDA build and in kernels/no_cuda.cpp (throwing DeviceError)
// otherwise. backend_for() in kernels/backend.cpp is its one caller.
#pragma once

namespace accrue {

class Backend;

Backend& cuda_backend(int device_index);

}  // namespace accrue
