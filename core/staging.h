// Host-built micro-batches to a GPU without stalling either side. stage() writes a host tensor
// into pinned memory and queues its copy to the device on the device's copy stream, after the
// work its compute stream has queued so far (the destination block's previous users); ready()
// makes the compute stream wait for that copy before the work queued after it. Staging
// micro-batch i + 1 before queuing micro-batch i's work therefore overlaps the copy with i's
// compute, and the host never waits: no synchronisation, no blocking copy. The pinned sources are
// kept until release_waited(), which the caller runs after a host read of the device (the
// training window's boundary): the compute stream waited for each copy, so every one is done.
// On the CPU staging is the identity. Read next: tensor.h.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace accrue {

class HostToDevice {
 public:
  explicit HostToDevice(Device device) : device_(device) {}
  ~HostToDevice();  // waits for the copies in flight: their pinned sources go back to the pool
  HostToDevice(const HostToDevice&) = delete;
  HostToDevice& operator=(const HostToDevice&) = delete;

  // A copy on its way: the device tensor it fills, and the copy's completion (none on the CPU).
  struct Pending {
    Tensor tensor;
    void* copied = nullptr;
    int64_t order = 0;  // its place among the copies this stager queued, from 1
  };
  // Queues the copy of `host` (a CPU tensor) to the device.
  Pending stage(const Tensor& host);
  // The device tensor, once the compute stream has been told to wait for its copy (once).
  Tensor ready(Pending& pending);
  // Gives back the pinned memory of the copies ready() waited for; call after the host has read
  // something the compute stream wrote after them.
  void release_waited();
  // Copies staged and never made ready (an exception unwound past them): the compute stream
  // waits for them, so their device tensors, back in the caching allocator, are not handed to
  // work that would run alongside the copy.
  void discard_pending();
  Device device() const { return device_; }

 private:
  Device device_;
  // The pinned sources of copies #released_ + 1 on, which may be in flight; of those, copies up
  // to #waited_ were waited for by the compute stream (a copy stream runs its copies in order).
  std::vector<Tensor> staged_;
  int64_t released_ = 0, waited_ = 0;
  std::vector<void*> pending_events_;  // copies staged and never waited for (released at exit)
};

}  // namespace accrue
