// CUDA graphs: the work a function queues on a device's stream, captured once and replayed with
// one launch. A training micro-step is a fixed sequence of kernels and library calls for a given
// input shape, so after one eager run (which sizes every scratch buffer and plan) it is captured
// and then replayed for every later micro-batch of that shape: the host launches one graph
// instead of each kernel. A replay reads and writes exactly the memory its capture saw, so
//   - the inputs are copied into the tensors the capture read (train/step_graphs.h does this),
//   - values that change between replays must live on the device (the backward seed, the
//     window's planned items: optim/accumulator.h), never in a kernel's arguments,
//   - the memory the capture allocates comes from the allocator's graph pool (allocator.h).
// Nothing inside a capture may wait for the device or read it back, no tensor made during a
// capture may outlive it (a failed capture otherwise), and a tensor made before the capture that
// the graph reads must outlive the graph. Read next: staging.h.
#pragma once

#include <cstddef>
#include <functional>

#include "core/device.h"

namespace accrue {

class DeviceGraph {
 public:
  DeviceGraph() = default;
  ~DeviceGraph();
  DeviceGraph(DeviceGraph&& o) noexcept;
  DeviceGraph& operator=(DeviceGraph&& o) noexcept;
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;

  // Captures what fn queues on the stream of `device` (a GPU): fn runs on the host once, and
  // nothing it queues runs until replay(). If fn throws, or the runtime refuses a call inside
  // the capture, the capture is discarded and GraphCaptureError is thrown with the reason; an op
  // that refused to be captured (NotCapturable, core/error.h) is rethrown as it is.
  static DeviceGraph capture(Device device, const std::function<void()>& fn);
  // Queues the captured work on the device's stream.
  void replay() const;
  bool defined() const { return exec_ != nullptr; }
  size_t nodes() const { return nodes_; }

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
  Device device_;
  size_t nodes_ = 0;
};

// Whether a capture is under way on `device`. Ops whose kernels take a value that changes from
// call to call as an argument (dropout's step) refuse to be captured.
bool graph_capturing(Device device);

}  // namespace accrue
