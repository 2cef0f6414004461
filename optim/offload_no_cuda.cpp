// The offloaded optimizer's transfers in a build without CUDA: a GPU cannot be asked for, so
// each throws DeviceError saying why (optim/offload.cpp copies with memcpy on the CPU).
#include "core/error.h"
#include "optim/offload_copies.h"

namespace accrue::optim {

void copy_to_host_async(void*, const void*, Device, size_t) {
  throw DeviceError("[offload] " + cuda_unavailable_reason());
}
void wait_copies_to_host(Device, bool) {
  throw DeviceError("[offload] " + cuda_unavailable_reason());
}
void copy_from_host_async(void*, Device, const void*, size_t) {
  throw DeviceError("[offload] " + cuda_unavailable_reason());
}

}  // namespace accrue::optim
