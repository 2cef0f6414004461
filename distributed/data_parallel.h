// Replicated data parallelism around the one-process boundary step: every rank holds the whole
// optimizer state and sums the window's gradient over the ranks once per window, either whole at
// the boundary or bucket by bucket as the last micro-backward finishes each range of the arena
// (the accumulator's buckets, --bucket-kib), overlapping communication with backward. The
// window's loss sum is summed too, so every rank reports the same loss. Hand one object to the
// accumulator as its GradientConsumer and PartialSumReducer. Read next: zero.h.
#pragma once

#include "distributed/communicator.h"
#include "optim/arena.h"
#include "optim/seams.h"

namespace accrue::distributed {

class GradientAllReduce : public optim::GradientConsumer, public optim::PartialSumReducer {
 public:
  GradientAllReduce(optim::ParameterArena& arena, Communicator& comm)
      : arena_(arena), comm_(comm) {}
  ~GradientAllReduce() override;  // waits for all-reduces in flight (they write the arena)
  GradientAllReduce(const GradientAllReduce&) = delete;
  GradientAllReduce& operator=(const GradientAllReduce&) = delete;

  // Starts the all-reduce of a finished range.
  void ready(int64_t begin, int64_t end) override;
  // Waits for the started ranges, or sums the whole arena when none was started.
  void finish() override;
  bool abandon() override;
  void sum(Tensor& partials) override { comm_.all_reduce_sum(partials); }
  void settle() override { comm_.settle(); }

 private:
  optim::ParameterArena& arena_;
  Communicator& comm_;
  bool started_ = false;  // this window has all-reduces in flight
};

// Sums small partials over a group of ranks: the pipeline stages' partial sums of squares for
// the global gradient norm, every rank's loss sums and stop votes.
class GroupSum : public optim::PartialSumReducer {
 public:
  explicit GroupSum(Communicator& comm) : comm_(comm) {}
  void sum(Tensor& partials) override { comm_.all_reduce_sum(partials); }
  void settle() override { comm_.settle(); }

 private:
  Communicator& comm_;
};

}  // namespace accrue::distributed
