// Every place where the host waits for a device or reads a computed value back, counted per kind
// over the whole process. On a GPU each one stalls the host until the device has drained the work
// queued before it, so a training window should have exactly one: the boundary's read of its sums
// (optim/accumulator.h). The CPU counts the same reads (item(), to_vector(), a copy to the host),
// so a test on either backend pins how often a window waits. The CUDA runtime (core/cuda/) adds
// the kinds that only a GPU has. Read next: allocator.h.
#pragma once

#include <cstdint>
#include <string>

namespace accrue {

struct HostWaits {
  int64_t reads = 0;             // values read back to the host: item(), to_vector()
  int64_t blocking_copies = 0;   // copies between host and device that return once done (CUDA)
  int64_t synchronizations = 0;  // stream, device and event synchronisations (CUDA)
  int64_t polls = 0;             // event and stream queries (CUDA)
  int64_t system_memory = 0;     // cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost (CUDA)

  // Every kind but reads: on a GPU a read is also a blocking copy, counted there.
  int64_t device_waits() const {
    return blocking_copies + synchronizations + polls + system_memory;
  }
  HostWaits operator+(const HostWaits& o) const {
    return {reads + o.reads, blocking_copies + o.blocking_copies,
            synchronizations + o.synchronizations, polls + o.polls,
            system_memory + o.system_memory};
  }
  HostWaits operator-(const HostWaits& o) const {
    return {reads - o.reads, blocking_copies - o.blocking_copies,
            synchronizations - o.synchronizations, polls - o.polls,
            system_memory - o.system_memory};
  }
  std::string str() const;  // "reads 1, blocking copies 1, ..."
};

enum class HostWait { kRead, kBlockingCopy, kSynchronization, kPoll, kSystemMemory };

// The counts since the process started (every thread).
HostWaits host_waits();
void count_host_wait(HostWait kind);

}  // namespace accrue
