// ZeRO stage 1 around the one-process optimizer: each of the ranks keeps the optimizer state of
// one slice of the arena only (Optimizer::restrict_to_slice). At the boundary the gradient is
// reduce-scattered (this rank's slice of the sum over ranks; the whole arena is zeroed for the
// next window), the norm's partial sums and the window's loss sum are all-reduced, each rank
// updates its slice, and the updated parameters (and 16-bit working copy) are all-gathered.
// One object plays the four seams of optim/seams.h; hand it to the accumulator as its
// GradientConsumer and PartialSumReducer. Read next: data_parallel.h.
#pragma once

#include "distributed/communicator.h"
#include "optim/optimizer.h"
#include "optim/seams.h"

namespace accrue::distributed {

class ZeroOptimizerState : public optim::GradientConsumer,
                           public optim::PartialSumReducer,
                           public optim::ParameterSync,
                           public optim::SliceGather {
 public:
  // Before the optimizer's first step; the arena's size must be a multiple of the world size
  // (ParameterArena(module, world_size)). Throws ValueError naming the sizes otherwise.
  ZeroOptimizerState(optim::Optimizer& optimizer, Communicator& comm);
  ZeroOptimizerState(const ZeroOptimizerState&) = delete;
  ZeroOptimizerState& operator=(const ZeroOptimizerState&) = delete;

  // The gradient is reduce-scattered whole at the boundary: ranges during backward are refused.
  void ready(int64_t begin, int64_t end) override;
  void finish() override;
  bool abandon() override { return true; }
  void sum(Tensor& partials) override { comm_.all_reduce_sum(partials); }
  void settle() override { comm_.settle(); }
  void after_update() override;
  void gather(const Tensor& slice, Tensor& full) override { comm_.all_gather(slice, full); }

 private:
  optim::Optimizer& optimizer_;
  Communicator& comm_;
};

}  // namespace accrue::distributed
