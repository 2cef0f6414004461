// backend_for: the one place that maps a device to its backend.
#include "kernels/backend.h"

#include "core/cuda_seam.h"

#include "kernels/cpu/cpu_backend.h"

namespace accrue {


Backend& backend_for(Device device) {
  if (device.is_cpu()) {
    static cpu::CpuBackend cpu_backend;
    return cpu_backend;
  }
  return cuda_backend(device.index);
}

}  // namespace accrue
