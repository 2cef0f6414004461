// The caching allocator: one per device. Freed blocks go into a size-keyed pool and are handed
// out again, so a training loop that repeats the same shapes stops asking the system (malloc or
// cudaMalloc) for memory after its first iteration. The statistics are exact and are what the
// accumulation tests and benchmarks read: live, peak, reserved, and system calls.
// Read next: tensor.h (Storage returns its block here when the last tensor lets go).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/device.h"

namespace accrue {

struct AllocatorStats {
  // Bytes handed out and not yet freed, each request rounded up to kGranule. A request served
  // by a larger pooled block counts its own size, so live and peak depend only on what the
  // program asks for, not on the pool's history.
  size_t live_bytes = 0;
  size_t peak_bytes = 0;      // highest live_bytes since construction or reset_peak()
  size_t reserved_bytes = 0;  // bytes held from the system: live blocks plus the pool
  size_t cached_bytes = 0;    // bytes in the pool, free for reuse
  int64_t system_allocs = 0;  // blocks ever taken from the system
  int64_t system_frees = 0;   // blocks ever returned to the system
  int64_t allocs = 0;         // allocate() calls served
  int64_t pool_hits = 0;      // allocate() calls served from the pool
  // Bytes owned by the graph pool (begin_graph_capture below), live or free: part of
  // reserved_bytes, never of cached_bytes.
  size_t graph_bytes = 0;
};

// Where a caching allocator gets its blocks: malloc for the host, cudaMalloc for a GPU.
struct SystemMemory {
  // nullptr when out of memory; other failures throw.
  void* (*allocate)(size_t nbytes, int device_index);
  void (*release)(void* ptr, int device_index);
  // What the system says about its memory, for out-of-memory messages.
  std::string (*describe)(int device_index);
};

class CachingAllocator {
 public:
  // Every block is a multiple of kGranule bytes and is at least 64-byte aligned.
  static constexpr size_t kGranule = 512;

  CachingAllocator(Device device, SystemMemory system);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns a block of at least nbytes (rounded up to kGranule); nullptr for nbytes == 0. When the
  // system is out of memory even after the pool was given back, throws OutOfMemoryError naming
  // the device, the size, the live and reserved bytes and what the system reports.
  void* allocate(size_t nbytes);
  // Returns a block to the pool; it is not given back to the system.
  void deallocate(void* ptr);
  // Gives every pooled (free) block back to the system. Live blocks are untouched.
  void empty_cache();
  void reset_peak();
  AllocatorStats stats() const;

  // CUDA graphs (core/graph.h). A replay writes the very addresses its capture was given, so from
  // begin_graph_capture() every block handed out, and every block freed, belongs to the graph
  // pool for good: later requests outside a capture never get one of them, and empty_cache()
  // keeps them. Captures take their blocks from that pool first (then from the general pool,
  // then the system). Every graph of a device shares the pool: their replays run one after
  // another on the device's stream and none keeps a tensor from one replay to the next, so the
  // pool holds what the largest graph needs, not the sum.
  // end_graph_capture() returns how many blocks the capture was given that are still live: a
  // tensor made during a capture must not outlive it (other graphs' replays would write it).
  void begin_graph_capture();
  size_t end_graph_capture();
  Device device() const { return device_; }

  static size_t round_size(size_t nbytes) { return (nbytes + kGranule - 1) / kGranule * kGranule; }

 private:
  // Returns every pooled block to the system; the caller holds mutex_.
  void release_pool_locked();
  // A free block of at least size from `pool` (less than twice size), or nullptr.
  static void* take_from(std::multimap<size_t, void*>& pool, size_t size, size_t& block);

  Device device_;
  SystemMemory system_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> pool_;  // free blocks by size
  struct LiveBlock {
    size_t block;  // the block's size
    size_t size;   // the rounded request it serves
  };
  std::unordered_map<void*, LiveBlock> live_;  // handed-out blocks
  AllocatorStats stats_;
  bool capturing_ = false;
  std::unordered_map<void*, size_t> graph_blocks_;  // the graph pool's blocks and their sizes
  std::multimap<size_t, void*> graph_free_;         // of which free
  std::unordered_map<void*, bool> captured_;        // given during the capture under way
};

// The allocator of a device, created on first use and alive until exit.
CachingAllocator& allocator_for(Device device);

// Page-locked host memory (cudaHostAlloc) for CPU tensors that a GPU copies to and from
// asynchronously: the offloaded optimizer's masters, moments and staging buffers
// (Tensor::zeros_pinned). Plain malloc when no GPU is usable. Its statistics are its own, apart
// from allocator_for(cpu)'s, so what was moved off the compute device can be measured even when
// that device is the CPU.
CachingAllocator& pinned_host_allocator();

}  // namespace accrue
