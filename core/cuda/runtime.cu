// The base layer's CUDA runtime (core/cuda_seam.h, core/cuda/runtime.h): device discovery (any
// driver error means "no GPU"), cudaMalloc-backed system memory for the caching allocator,
// pinned host memory, byte copies and zeroing, and each device's stream and fault record.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/cuda_seam.h"
#include "core/device.h"
#include "core/host_waits.h"

namespace accrue {

namespace {

constexpr int kMaxDevices = 16;

// Bit d: device d has a runtime (cuda::runtime created it). Every stream accrue queues work on
// (the runtime's, the offload copy stream, NCCL's side stream) is created after that, so a
// device whose bit is clear has nothing queued.
std::atomic<uint32_t> devices_in_use{0};

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

// nullptr only when the device is out of memory: the caching allocator then frees its pool and
// retries once, then throws naming the sizes. Any other error (a sticky one left by a faulting
// kernel, say) is not an out-of-memory and throws at once with its own string and file:line.
// Only the device is made current here, not its runtime: creating one may itself release
// the allocator's pool (runtime_malloc), so the allocator (whose lock is held here) must never
// wait on the runtime's lock.
void* device_allocate(size_t nbytes, int device) {
  ACCRUE_CUDA_CHECK(cudaSetDevice(device));
  void* ptr = nullptr;
  count_host_wait(HostWait::kSystemMemory);
  const cudaError_t status = cudaMalloc(&ptr, nbytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it
    return nullptr;
  }
  ACCRUE_CUDA_CHECK(status);
  return ptr;
}

std::string device_memory_info(int device) {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(device) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return "cudaMemGetInfo failed";
  }
  return str_cat("cudaMemGetInfo: ", free_bytes, " bytes free of ", total_bytes);
}

// After a synchronisation of ctx's stream that followed enqueue_fault_readback(): throws the
// first fault a kernel recorded (a bad device-resident index or label) and clears it.
void check_faults(cuda::DeviceRuntime& ctx) {
  const cuda::DeviceFault f = *ctx.fault_host;
  if (f.op == cuda::kNoFault) return;
  ctx.fault_host->op = cuda::kNoFault;
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(ctx.fault, 0, sizeof(cuda::DeviceFault), ctx.stream));
  const char* what = f.op == cuda::kGatherIndex    ? "[gather_rows] index "
                     : f.op == cuda::kScatterIndex ? "[index_add_rows] index "
                                                   : "[cross_entropy] label ";
  throw ValueError(str_cat(what, f.value, " at position ", f.position, " is out of range [0, ",
                           f.limit, ") (found by a kernel on cuda:", ctx.device,
                           "; the results since then are not valid)"));
}

void enqueue_fault_readback(cuda::DeviceRuntime& ctx) {
  ACCRUE_CUDA_CHECK(cudaMemcpyAsync(ctx.fault_host, ctx.fault, sizeof(cuda::DeviceFault),
                                    cudaMemcpyDeviceToHost, ctx.stream));
}

// Pinned host memory for pinned_host_allocator(). Allocated with every device's work in mind
// (cudaHostAllocPortable); nullptr when the host is out of page-locked memory.
void* pinned_allocate(size_t nbytes, int) {
  void* ptr = nullptr;
  count_host_wait(HostWait::kSystemMemory);
  const cudaError_t status = cudaHostAlloc(&ptr, nbytes, cudaHostAllocPortable);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  ACCRUE_CUDA_CHECK(status);
  return ptr;
}
// Never throws (see device_release). Why wait at all: the block may be the source or the
// destination of an asynchronous copy still queued on a stream of any device (the offloaded
// optimizer's copies between the device and the pinned host buffers, optim/offload_copies.h),
// and cudaFreeHost is not documented to wait for streams of other devices; a copy in flight
// into unpinned, reused pages is undefined. Only the devices this process has used can have
// such a copy: waiting on the others would create a context (and its memory) on GPUs the
// process never touches, on every rank of a node. On any failure the block leaks rather than
// being freed too early.
void pinned_release(void* ptr, int) {
  int current = 0;
  bool idle = cudaGetDevice(&current) == cudaSuccess;
  const uint32_t used = devices_in_use.load(std::memory_order_acquire);
  for (int d = 0; d < discovery().count && d < kMaxDevices; ++d) {
    if ((used >> d & 1u) == 0) continue;
    idle = idle && cudaSetDevice(d) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
  }
  count_host_wait(HostWait::kSystemMemory);
  if (idle) cudaFreeHost(ptr);
  cudaSetDevice(current);  // the caller's device stays current
  cudaGetLastError();
}
std::string pinned_describe(int) {
  return "cudaHostAlloc could not page-lock more host memory";
}

// Never throws: it may run while the runtime unloads. A failure here leaks the block. The
// device is synchronised first: kernels still queued may be using the block.
void device_release(void* ptr, int device) {
  count_host_wait(HostWait::kSystemMemory);
  if (cudaSetDevice(device) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess) {
    cudaFree(ptr);
  }
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
  return {device_allocate, device_release, device_memory_info};
}
SystemMemory cuda_pinned_host_memory() {
  return {pinned_allocate, pinned_release, pinned_describe};
}

void synchronize(Device device) {
  if (!device.is_cuda()) return;
  cuda::DeviceRuntime& ctx = cuda::runtime(device.index);
  enqueue_fault_readback(ctx);
  ACCRUE_CUDA_WAIT(cudaStreamSynchronize(ctx.stream));
  check_faults(ctx);
}

std::string device_name(Device device) {
  if (device.is_cpu()) return cpu_model_name();
  cuda::runtime(device.index);
  cudaDeviceProp prop{};
  ACCRUE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
  return prop.name;
}

DeviceMemory device_memory(Device device) {
  if (device.is_cpu()) return {};
  cuda::runtime(device.index);
  size_t free_bytes = 0, total_bytes = 0;
  ACCRUE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {total_bytes - free_bytes, total_bytes};
}

void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t nbytes) {
  if (nbytes == 0) return;
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  cuda::DeviceRuntime& ctx = cuda::runtime(gpu.index);
  if (dst_device == src_device) {  // within one device: stream order is enough
    ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, ctx.stream));
    return;
  }
  cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
  if (dst_device.is_cpu()) kind = cudaMemcpyDeviceToHost;
  if (src_device.is_cpu()) kind = cudaMemcpyHostToDevice;
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device != src_device) {
    // The source is written on its own device's stream: the copy waits for that work first.
    cuda::DeviceRuntime& src_ctx = cuda::runtime(src_device.index);
    cudaEvent_t written;
    ACCRUE_CUDA_CHECK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(written, src_ctx.stream);
    const cudaError_t waited =
        recorded == cudaSuccess ? cudaStreamWaitEvent(ctx.stream, written, 0) : recorded;
    cudaEventDestroy(written);  // released once the wait has been satisfied
    ACCRUE_CUDA_CHECK(waited);
    cuda::runtime(gpu.index);  // the destination device is current again
    ACCRUE_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, ctx.stream));
    // A fault on the source device belongs to its own next host read.
  } else {
    ACCRUE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, ctx.stream));
  }
  // Host memory on either side may be reused as soon as we return; a host read also reports
  // what the kernels before it found wrong.
  enqueue_fault_readback(ctx);
  count_host_wait(HostWait::kBlockingCopy);
  ACCRUE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  check_faults(ctx);
}

void cuda_zero_bytes(void* dst, Device device, size_t nbytes) {
  if (nbytes == 0) return;
  cuda::DeviceRuntime& ctx = cuda::runtime(device.index);
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(dst, 0, nbytes, ctx.stream));
}

namespace cuda {

void* runtime_malloc(int device, size_t nbytes, const char* what) {
  ACCRUE_CUDA_CHECK(cudaSetDevice(device));
  void* ptr = nullptr;
  count_host_wait(HostWait::kSystemMemory);
  cudaError_t status = cudaMalloc(&ptr, nbytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    allocator_for(Device::cuda(device)).empty_cache();
    ACCRUE_CUDA_CHECK(cudaSetDevice(device));
    status = cudaMalloc(&ptr, nbytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw OutOfMemoryError(str_cat("[cuda] cuda:", device, ": out of memory allocating ", nbytes,
                                     " bytes of ", what, " (", device_memory_info(device), ")"));
    }
  }
  ACCRUE_CUDA_CHECK(status);
  return ptr;
}

DeviceRuntime& runtime(int device) {
  static std::unique_ptr<DeviceRuntime> runtimes[kMaxDevices];
  static std::mutex mutex;
  if (device < 0 || device >= cuda_device_count() || device >= kMaxDevices) {
    throw DeviceError(str_cat("[cuda] device cuda:", device, " is not available (",
                              cuda_device_count(), " present) ", cuda_unavailable_reason()));
  }
  ACCRUE_CUDA_CHECK(cudaSetDevice(device));
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = runtimes[device];
  if (!slot) {
    auto rt = std::make_unique<DeviceRuntime>();
    rt->device = device;
    ACCRUE_CUDA_CHECK(cudaStreamCreateWithFlags(&rt->stream, cudaStreamNonBlocking));
    rt->fault =
        static_cast<DeviceFault*>(runtime_malloc(device, sizeof(DeviceFault), "fault record"));
    ACCRUE_CUDA_CHECK(cudaMallocHost(&rt->fault_host, sizeof(DeviceFault)));
    *rt->fault_host = DeviceFault{};
    // On the device's own stream (non-blocking: the legacy default stream would not order it).
    ACCRUE_CUDA_CHECK(cudaMemsetAsync(rt->fault, 0, sizeof(DeviceFault), rt->stream));
    ACCRUE_CUDA_CHECK(cudaStreamSynchronize(rt->stream));
    slot = std::move(rt);
    devices_in_use.fetch_or(uint32_t{1} << device, std::memory_order_release);
  }
  return *slot;
}

}  // namespace cuda
}  // namespace accrue
