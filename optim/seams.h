// The seams around the one-process boundary step, where sharding, data parallelism, offloading
// and pipeline stages plug in without the optimizer or the accumulator knowing which runs:
//   GradientConsumer  takes the window's gradient as backward finishes it (the accumulator hands
//                     it finished ranges of the gradient arena during the last micro-backward,
//                     then finish() at the boundary, before the norm): an all-reduce, a
//                     reduce-scatter, a copy to the host;
//   PartialSumReducer sums small per-process partials (the norm's {sum of squares, non-finite
//                     count}, the window's loss sum) so every process decides clip and skip alike;
//   ParameterSync     runs after the fused update (an all-gather of the updated shards);
//   SliceGather       builds the full optimizer state from the slices, for checkpoints.
// Implementations: distributed/data_parallel.h and distributed/zero.h over a communicator,
// optim/offload.h for the host copy (a GradientConsumer and a ParameterSync); train/strategies.cpp
// chains the consumers of a composition, ParameterSyncChain below two syncs. Read next:
// optimizer.h.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace accrue::optim {

class GradientConsumer {
 public:
  virtual ~GradientConsumer() = default;
  // Elements [begin, end) of the gradient arena are final for this window (ranges arrive in the
  // same order on every process and do not overlap).
  virtual void ready(int64_t begin, int64_t end) = 0;
  // After each micro-step's backward (ZeRO-2's reduce-scatter of every micro-step's gradient).
  virtual void micro_step_done() {}
  // At the boundary, after every range was handed over: complete the work (wait, reduce-scatter).
  virtual void finish() = 0;
  // The window is dropped: wait for work in flight. Returns false when that failed and the
  // gradient arena may still be written (the job is lost; it must not be zeroed).
  virtual bool abandon() = 0;
};

class PartialSumReducer {
 public:
  virtual ~PartialSumReducer() = default;
  // partials <- their sum over every process, in place.
  virtual void sum(Tensor& partials) = 0;
  // Before the host reads the sums: waits for the collectives to complete under the
  // communicator's watchdog (distributed/communicator.h, Communicator::settle).
  virtual void settle() {}
};

class ParameterSync {
 public:
  virtual ~ParameterSync() = default;
  // After the fused update of this process's parameters.
  virtual void after_update() = 0;
  // After the optimizer's scalars changed outside a step (loss scaling set, state loaded).
  virtual void scalars_changed() {}
  // Before the optimizer's state is overwritten: nothing in flight may still read it.
  virtual void quiesce() {}
};

// Two parameter syncs in turn: the offload's copy of the updated slice to the device, then
// ZeRO's all-gather of the slices.
class ParameterSyncChain : public ParameterSync {
 public:
  ParameterSyncChain(ParameterSync& first, ParameterSync& second)
      : first_(first), second_(second) {}
  void after_update() override {
    first_.after_update();
    second_.after_update();
  }
  void scalars_changed() override {
    first_.scalars_changed();
    second_.scalars_changed();
  }
  void quiesce() override {
    first_.quiesce();
    second_.quiesce();
  }

 private:
  ParameterSync& first_;
  ParameterSync& second_;
};

class SliceGather {
 public:
  virtual ~SliceGather() = default;
  // full <- every process's slice, in process order (checkpoints of restricted state).
  virtual void gather(const Tensor& slice, Tensor& full) = 0;
};

}  // namespace accrue::optim
