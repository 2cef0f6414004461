// The seam between the kernels layer and its CUDA half: the CUDA backend of a device, defined in
// kernels/cuda/backend.cu by a CUDA build and in kernels/no_cuda.cpp (throwing DeviceError)
// otherwise; why a GPU cannot convolve (kernels/cuda/conv.cu, or kernels/no_cuda.cpp); the
// profiler's event marks (kernels/cuda/marks.cu). backend_for() and conv_unavailable_reason() in
// kernels/backend.cpp and make_profiling_backend() in kernels/profile.cpp are their callers.
#pragma once

#include <memory>
#include <string>

namespace accrue {

class Backend;
class DeviceMarks;

Backend& cuda_backend(int device_index);
// The device's kernel context (library handles, scratch), made now.
void prepare_cuda_backend(int device_index);
// "" when this build has cuDNN; otherwise what is missing.
std::string cuda_conv_unavailable_reason();
// CUDA events on the device's stream, as the profiler's marks (kernels/profile.h).
std::unique_ptr<DeviceMarks> make_cuda_marks(int device_index);

}  // namespace accrue
