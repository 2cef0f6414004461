// Caching allocator implementation: best-fit reuse from a pool keyed by block size. A pooled
// block is reused for a request only when it is less than twice the request, so a small tensor
// never pins a huge block.
#include "core/allocator.h"

#include <cstdlib>
#include <limits>
#include <memory>
#include <new>

#include "core/cuda_seam.h"
#include "core/error.h"

namespace accrue {

CachingAllocator::CachingAllocator(Device device, SystemMemory system)
    : device_(device), system_(system) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks still referenced at exit belong to static tensors; leave them to the OS.
  for (auto& [size, ptr] : pool_) system_.release(ptr, device_.index);
  for (auto& [size, ptr] : graph_free_) system_.release(ptr, device_.index);
}

void* CachingAllocator::take_from(std::multimap<size_t, void*>& pool, size_t size, size_t& block) {
  auto it = pool.lower_bound(size);
  if (it == pool.end() || it->first >= 2 * size) return nullptr;
  block = it->first;
  void* ptr = it->second;
  pool.erase(it);
  return ptr;
}

void* CachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  // Past a quarter of the address space no system has the memory, and the rounding below (and the
  // pool's 2 x size test) would wrap around to a small block.
  if (nbytes > std::numeric_limits<size_t>::max() / 4) {
    throw OutOfMemoryError(str_cat("[allocator] ", device_.str(), ": a request of ", nbytes,
                                   " bytes exceeds any memory"));
  }
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  size_t block = size;
  void* ptr = capturing_ ? take_from(graph_free_, size, block) : nullptr;
  if (ptr != nullptr) {
    ++stats_.pool_hits;
  } else if ((ptr = take_from(pool_, size, block)) != nullptr) {
    stats_.cached_bytes -= block;
    ++stats_.pool_hits;
  } else {
    block = size;
    ptr = system_.allocate(size, device_.index);
    // Giving the pool back waits for the device, which a capture under way forbids.
    if (ptr == nullptr && !pool_.empty() && !capturing_) {
      // Out of memory with blocks cached: give them back and try once more.
      release_pool_locked();
      ptr = system_.allocate(size, device_.index);
    }
    if (ptr == nullptr) {
      throw OutOfMemoryError(str_cat("[allocator] ", device_.str(), ": out of memory allocating ",
                                     size, " bytes with ", stats_.live_bytes, " bytes live and ",
                                     stats_.reserved_bytes, " reserved (",
                                     system_.describe ? system_.describe(device_.index) : "", ")"));
    }
    ++stats_.system_allocs;
    stats_.reserved_bytes += size;
  }
  if (capturing_) {
    if (graph_blocks_.emplace(ptr, block).second) stats_.graph_bytes += block;
    captured_[ptr] = true;
  }
  live_.emplace(ptr, LiveBlock{block, size});
  ++stats_.allocs;
  stats_.live_bytes += size;
  if (stats_.live_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.live_bytes;
  return ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    throw std::logic_error(
        str_cat("[allocator] ", device_.str(), ": free of a pointer it did not hand out"));
  }
  const size_t block = it->second.block;
  stats_.live_bytes -= it->second.size;
  live_.erase(it);
  captured_.erase(ptr);
  // A block freed during a capture may be read by every replay of the graph: it joins the pool.
  if (capturing_ && graph_blocks_.emplace(ptr, block).second) stats_.graph_bytes += block;
  if (graph_blocks_.count(ptr)) {
    graph_free_.emplace(block, ptr);
    return;
  }
  stats_.cached_bytes += block;
  pool_.emplace(block, ptr);
}

void CachingAllocator::begin_graph_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capturing_) throw std::logic_error("[allocator] a graph capture is already under way");
  capturing_ = true;
}

size_t CachingAllocator::end_graph_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  capturing_ = false;
  const size_t survivors = captured_.size();
  captured_.clear();
  return survivors;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_pool_locked();
}

void CachingAllocator::release_pool_locked() {
  for (auto& [size, ptr] : pool_) system_.release(ptr, device_.index);
  stats_.system_frees += static_cast<int64_t>(pool_.size());
  stats_.reserved_bytes -= stats_.cached_bytes;
  stats_.cached_bytes = 0;
  pool_.clear();
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.live_bytes;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

namespace {

void* host_allocate(size_t nbytes, int) {
  return std::aligned_alloc(64, nbytes);
}
void host_release(void* ptr, int) {
  std::free(ptr);
}
std::string host_describe(int) {
  return "malloc returned null";
}

}  // namespace

CachingAllocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    static CachingAllocator* host =
        new CachingAllocator(Device::cpu(), {host_allocate, host_release, host_describe});
    return *host;
  }
  // Never destroyed, like the host allocator: static tensors may outlive any destructor order,
  // and the CUDA runtime may already be unloading at exit.
  constexpr int kMaxDevices = 16;
  static CachingAllocator* gpus[kMaxDevices] = {};
  static std::mutex mutex;
  if (device.index < 0 || device.index >= cuda_device_count() || device.index >= kMaxDevices) {
    throw DeviceError(str_cat("[allocator] device ", device.str(), " is not available: ",
                              cuda_unavailable_reason().empty()
                                  ? str_cat(cuda_device_count(), " CUDA device(s) present")
                                  : cuda_unavailable_reason()));
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = gpus[device.index];
  if (!slot) slot = new CachingAllocator(device, cuda_system_memory());
  return *slot;
}

CachingAllocator& pinned_host_allocator() {
  static CachingAllocator* pinned = new CachingAllocator(
      Device::cpu(), cuda_device_count() > 0
                         ? cuda_pinned_host_memory()
                         : SystemMemory{host_allocate, host_release, host_describe});
  return *pinned;
}

}  // namespace accrue
