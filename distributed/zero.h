// ZeRO stages 1 and 2 around the one-process optimizer: each of the N ranks keeps the optimizer
// state of one slice of the arena only (Optimizer::restrict_to_slice); the norm's partial sums
// and the window's loss sum are all-reduced, each rank updates its slice, and the updated
// parameters (and 16-bit working copy) are all-gathered. The stages differ in the gradient:
//   stage 1             the whole window gradient is reduce-scattered at the boundary into a
//                       slice buffer of the optimizer's own; the arena is zeroed for the next;
//   stage 2, boundary   the same exchange in place: the optimizer reads this rank's slice of the
//                       gradient arena, so no second buffer (gradient memory Psi, traffic once);
//   stage 2, micro-step every micro-step's gradient is reduce-scattered and added into a
//                       persistent slice [Psi / N]; the whole gradient exists only during a
//                       window (ParameterArena::release_grads), and the traffic is k times.
// With the offloaded optimizer (optim/offload.h) the masters and the state's slice live on the
// host: the slice of the gradient is copied there, updated, and copied back, then gathered on
// the device (stage 1 then exchanges in place as stage 2 does).
// ZeRO-3 (parameters sharded too) is zero3.h. One object plays the four seams of optim/seams.h;
// hand it to the accumulator as its GradientConsumer and PartialSumReducer. Read next:
// zero3.h.
#pragma once

#include <string>

#include "distributed/communicator.h"
#include "optim/optimizer.h"
#include "optim/seams.h"

namespace accrue::distributed {

// When ZeRO-2 reduce-scatters the gradient (--zero-reduce).
enum class ZeroReduce { kBoundary, kMicroStep };
const char* zero_reduce_name(ZeroReduce reduce);  // "boundary", "micro-step"
// Throws ValueError naming the choices.
ZeroReduce parse_zero_reduce(const std::string& name);

// Which of ZeRO-3's gathers start a layer ahead (--zero-prefetch; zero3.h).
enum class ZeroPrefetch { kNone, kForward, kForwardAndBackward };
const char* zero_prefetch_name(ZeroPrefetch prefetch);  // "none", "forward", "forward-and-backward"
// Throws ValueError naming the choices.
ZeroPrefetch parse_zero_prefetch(const std::string& name);

class ZeroOptimizerState : public optim::GradientConsumer,
                           public optim::PartialSumReducer,
                           public optim::ParameterSync,
                           public optim::SliceGather {
 public:
  // Before the optimizer's first step; the arena's size must be a multiple of the world size
  // (ParameterArena(module, world_size)). Throws ValueError naming the sizes otherwise, or for a
  // stage other than 1 and 2.
  ZeroOptimizerState(optim::Optimizer& optimizer, Communicator& comm, int stage = 1,
                     ZeroReduce reduce = ZeroReduce::kBoundary);
  ZeroOptimizerState(const ZeroOptimizerState&) = delete;
  ZeroOptimizerState& operator=(const ZeroOptimizerState&) = delete;

  // Before a window's first micro-step, with the most micro-steps any rank runs in it
  // (Window::most_micro): the micro-step policy takes the whole gradient's memory and joins that
  // many reduce-scatters, with zeros for micro-steps this rank does not have.
  void begin_window(int64_t most_micro_steps);

  // The gradient is reduce-scattered whole: ranges during backward are refused.
  void ready(int64_t begin, int64_t end) override;
  void micro_step_done() override;
  void finish() override;
  bool abandon() override;
  void sum(Tensor& partials) override { comm_.all_reduce_sum(partials); }
  void settle() override { comm_.settle(); }
  void after_update() override;
  void gather(const Tensor& slice, Tensor& full) override { comm_.all_gather(slice, full); }

  // Bytes of the micro-step policy's persistent slice (0 otherwise).
  size_t accumulated_bytes() const { return accumulated_.defined() ? accumulated_.nbytes() : 0; }

 private:
  // ZeRO-2's micro-step policy: what the window's hooks do beyond the boundary's exchange.
  bool reduces_each_micro_step() const { return stage_ == 2 && reduce_ == ZeroReduce::kMicroStep; }
  // The gradient arena reduce-scattered in place: this rank's slice holds the sum over ranks.
  void reduce_scatter_in_place();
  // Zeroes the gradient arena outside this rank's slice.
  void zero_outside_slice();

  optim::Optimizer& optimizer_;
  Communicator& comm_;
  int stage_;
  ZeroReduce reduce_;
  int64_t offset_ = 0, n_ = 0;  // this rank's slice
  int64_t most_micro_ = -1;     // of the open window (micro-step policy); -1: none open
  int64_t micro_done_ = 0;      // reduce-scatters of the open window
  Tensor accumulated_;          // [n] the micro-step policy's sum of this window's slices
  bool release_after_update_ = false;
};

}  // namespace accrue::distributed
