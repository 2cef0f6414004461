// The CUDA entry points core/ needs: device discovery (any driver error means "no GPU"),
// cudaMalloc-backed system memory for the caching allocator, host <-> device copies, and the
// per-device contexts.
#include <memory>
#include <mutex>

#include "core/allocator.h"
#include "core/device.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/context.h"

namespace accrue {

namespace {

struct Discovery {
  int count = 0;
  std::string reason;
};

const Discovery& discovery() {
  static const Discovery d = [] {
    Discovery out;
    const cudaError_t status = cudaGetDeviceCount(&out.count);
    if (status != cudaSuccess) {
      out.count = 0;
      out.reason = str_cat("no usable CUDA device: ", cudaGetErrorString(status));
      cudaGetLastError();  // clear the sticky error
    } else if (out.count == 0) {
      out.reason = "no CUDA device found";
    }
    return out;
  }();
  return d;
}

void* device_allocate(size_t nbytes, int device) {
  cuda::context(device);
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, nbytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;  // the caching allocator frees its pool and retries, then throws
  }
  return ptr;
}

// Never throws: it may run while the runtime unloads. A failure here leaks the block.
void device_release(void* ptr, int device) {
  if (cudaSetDevice(device) == cudaSuccess) cudaFree(ptr);
  cudaGetLastError();
}

}  // namespace

bool cuda_built() {
  return true;
}
int cuda_device_count() {
  return discovery().count;
}
std::string cuda_unavailable_reason() {
  return discovery().reason;
}
SystemMemory cuda_system_memory() {
  return {device_allocate, device_release};
}

std::string cpu_model_name();

void synchronize(Device device) {
  if (device.is_cuda())
    ACCRUE_CUDA_CHECK(cudaStreamSynchronize(cuda::context(device.index).stream));
}

std::string device_name(Device device) {
  if (device.is_cpu()) return cpu_model_name();
  cuda::context(device.index);
  cudaDeviceProp prop{};
  ACCRUE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
  return prop.name;
}

void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t nbytes) {
  if (nbytes == 0) return;
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  cuda::DeviceContext& ctx = cuda::context(gpu.index);
  cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  if (dst_device.is_cpu()) kind = cudaMemcpyDeviceToHost;
  if (src_device.is_cpu()) kind = cudaMemcpyHostToDevice;
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
    ACCRUE_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, ctx.stream));
  } else {
    ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, ctx.stream));
  }
  // Host memory on either side may be reused as soon as we return.
  ACCRUE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
}

namespace cuda {

DeviceContext& context(int device) {
  constexpr int kMaxDevices = 16;
  static std::unique_ptr<DeviceContext> contexts[kMaxDevices];
  static std::mutex mutex;
  if (device < 0 || device >= cuda_device_count() || device >= kMaxDevices) {
    throw DeviceError(str_cat("[cuda] device cuda:", device, " is not available (",
                              cuda_device_count(), " present) ", cuda_unavailable_reason()));
  }
  ACCRUE_CUDA_CHECK(cudaSetDevice(device));
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = contexts[device];
  if (!slot) {
    auto ctx = std::make_unique<DeviceContext>();
    ctx->device = device;
    ACCRUE_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    ACCRUE_CUBLAS_CHECK(cublasCreate(&ctx->cublas));
    ACCRUE_CUBLAS_CHECK(cublasSetStream(ctx->cublas, ctx->stream));
    ACCRUE_CUBLAS_CHECK(cublasLtCreate(&ctx->cublas_lt));
    slot = std::move(ctx);
  }
  return *slot;
}

}  // namespace cuda
}  // namespace accrue
