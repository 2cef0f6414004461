// The offloaded optimizer's traffic (ZeRO-Offload, for one device): the float masters, the
// optimizer state and host copies of the gradient live in pinned host memory
// (ParameterArena::offload_masters; the Optimizer's state sits beside the masters), the compute
// device keeps the gradient arena and the copy of the weights it computes with. HostOffload is
// the piece around the optimizer that moves the bytes, once per window:
//   1. as the accumulator's GradientConsumer it takes the gradient to the host: prefetch()
//      (ready()) starts copying a finished range while the last micro-backward goes on, fetch()
//      (finish()) copies what was not started, waits for every copy and zeroes the device
//      gradient;
//   2. the optimizer's usual pipeline (norm, boundary scalars, fused update) runs on the host,
//      on the CPU backend, over the host gradient;
//   3. as its ParameterSync, push() copies the updated weights back: the 16-bit working copy the
//      fused pass wrote on the host (2 bytes a parameter) or the masters themselves (4), without
//      waiting, and the loss scale the next backward seeds with.
// On a GPU the copies are asynchronous (optim/cuda/offload_copies.cu: a copy stream for the
// gradient, the compute stream for the weights); with the model on the CPU they are memcpys done at
// once, so the whole path runs and is tested without a GPU. Read next: optimizer.h.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "optim/arena.h"
#include "optim/optimizer.h"
#include "optim/seams.h"

namespace accrue::optim {

// Bytes moved between the compute device and the host so far.
struct OffloadTraffic {
  int64_t steps = 0;            // fetch() calls: one per optimizer step
  size_t to_host_bytes = 0;     // gradient
  size_t from_host_bytes = 0;   // weights (nothing after a skipped step)
  int64_t prefetched = 0;       // copies started by prefetch() (during backward)
  int64_t fetched_at_step = 0;  // copies started by fetch() (at the boundary)
};

class HostOffload : public GradientConsumer, public ParameterSync {
 public:
  // The optimizer's arena must have offloaded masters (ParameterArena::offload_masters); this
  // becomes the optimizer's ParameterSync. Build it before set_loss_scaling, so the scale reaches
  // the device; destroy it before the optimizer.
  explicit HostOffload(Optimizer& optimizer);
  // Waits for every copy in flight (the host buffers go back to the pinned pool, which may hand
  // them out at once).
  ~HostOffload() override;
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  // Starts copying the device gradient's elements [begin, end) to the host (their backward is
  // done). Ranges of one window do not overlap.
  void prefetch(int64_t begin, int64_t end);
  // Copies every element not prefetched, waits for all copies, zeroes the device gradient.
  void fetch();
  // Under ZeRO (the optimizer restricted to a slice): copies only elements [begin, end) of the
  // gradient to the host and of the weights back; ZeRO gathers the rest.
  void restrict_to(int64_t begin, int64_t end);
  // Waits for copies in flight and forgets them: the window was abandoned.
  void discard();
  // GradientConsumer: ready() is prefetch(), finish() is fetch(), abandon() is discard() (false
  // when waiting failed).
  void ready(int64_t begin, int64_t end) override { prefetch(begin, end); }
  void finish() override { fetch(); }
  bool abandon() override;
  // ParameterSync: the new weights (unless the step was skipped) and the loss scale to the
  // device; before the state is overwritten, waits for copies still reading it.
  void after_update() override;
  void scalars_changed() override { send_loss_scale(); }
  void quiesce() override;
  // Sends the updated weights to the device copy the model computes with (nothing if skipped).
  void push(bool skipped);
  // Copies a host tensor to a device tensor of the same shape and dtype without waiting (the
  // loss scale the next backward seeds with); the host bytes must not change before fetch().
  void send(const Tensor& host, Tensor& device);

  const OffloadTraffic& traffic() const { return traffic_; }

 private:
  void copy_range(int64_t begin, int64_t end);
  void send_loss_scale();
  // Waits for the copies in flight both ways; report_faults: see wait_copies_to_host
  // (offload_copies.h).
  void wait(bool report_faults);

  Optimizer& optimizer_;
  ParameterArena& arena_;
  Device device_;           // the arena's compute device
  Tensor grads_, working_;  // the arena's host copies of the gradient and the 16-bit copy
  Tensor device_scale_;     // the loss scale on the device, for the backward seed
  std::vector<std::pair<int64_t, int64_t>> started_;  // this window's copied ranges
  bool in_flight_ = false;    // copies to or from the host may still be running (a GPU)
  int64_t lo_ = 0, hi_ = -1;  // the elements copied (restrict_to); hi_ < 0: all
  OffloadTraffic traffic_;
};

}  // namespace accrue::optim
