// ZeRO stages 1 and 2 (see zero.h).
#include "distributed/zero.h"

#include "core/error.h"
#include "kernels/backend.h"

namespace accrue::distributed {

const char* zero_reduce_name(ZeroReduce reduce) {
  return reduce == ZeroReduce::kBoundary ? "boundary" : "micro-step";
}

ZeroReduce parse_zero_reduce(const std::string& name) {
  if (name == "boundary") return ZeroReduce::kBoundary;
  if (name == "micro-step") return ZeroReduce::kMicroStep;
  throw ValueError(str_cat("[zero] unknown reduce policy '", name, "' (boundary, micro-step)"));
}

const char* zero_prefetch_name(ZeroPrefetch prefetch) {
  switch (prefetch) {
    case ZeroPrefetch::kNone:
      return "none";
    case ZeroPrefetch::kForward:
      return "forward";
    case ZeroPrefetch::kForwardAndBackward:
      break;
  }
  return "forward-and-backward";
}

ZeroPrefetch parse_zero_prefetch(const std::string& name) {
  for (ZeroPrefetch p :
       {ZeroPrefetch::kNone, ZeroPrefetch::kForward, ZeroPrefetch::kForwardAndBackward}) {
    if (name == zero_prefetch_name(p)) return p;
  }
  throw ValueError(
      str_cat("[zero] unknown prefetch '", name, "' (none, forward, forward-and-backward)"));
}

ZeroOptimizerState::ZeroOptimizerState(optim::Optimizer& optimizer, Communicator& comm, int stage,
                                       ZeroReduce reduce)
    : optimizer_(optimizer), comm_(comm), stage_(stage), reduce_(reduce) {
  if (stage != 1 && stage != 2) {
    throw ValueError(str_cat("[zero] stage ", stage, " is not 1 or 2 (stage 3: zero3.h)"));
  }
  optim::ParameterArena& arena = optimizer.arena();
  const int64_t world = comm.world_size();
  if (arena.size() % world != 0) {
    throw ValueError(str_cat("[zero] an arena of ", arena.size(), " elements does not split ",
                             "into ", world, " equal shards; build it with ParameterArena(module, ",
                             world, ")"));
  }
  n_ = arena.size() / world;
  offset_ = comm.rank() * n_;
  // Stage 2 (and stage 1 with an offloaded optimizer) reduce-scatters in place and the
  // optimizer reads its slice of the arena (or of the arena's host copy); stage 1 keeps a slice
  // of its own. The micro-step policy adds each micro-step's slice into `accumulated_`, and
  // puts the window's sum into the arena's slice at the boundary.
  optimizer.restrict_to_slice(offset_, n_, stage == 2);
  if (reduces_each_micro_step()) {
    accumulated_ = Tensor::zeros({n_}, arena.dtype(), arena.device());
  }
  optimizer.set_partial_sum_reducer(this);
  optimizer.set_parameter_sync(this);
  optimizer.set_slice_gather(this);
}

void ZeroOptimizerState::begin_window(int64_t most_micro_steps) {
  if (!reduces_each_micro_step()) return;
  optimizer_.arena().acquire_grads();
  most_micro_ = most_micro_steps;
  micro_done_ = 0;
}

void ZeroOptimizerState::ready(int64_t, int64_t) {
  throw ValueError(
      "[zero] the sharded optimizer (--zero 1 and 2) reduce-scatters the whole gradient; it "
      "does not combine with all-reduce buckets during backward (--bucket-kib)");
}

void ZeroOptimizerState::reduce_scatter_in_place() {
  Tensor& grads = optimizer_.arena().grads();
  Tensor own = grads.narrow(offset_, n_);
  comm_.reduce_scatter(grads, own);
}

void ZeroOptimizerState::zero_outside_slice() {
  Tensor& grads = optimizer_.arena().grads();
  if (offset_ > 0) grads.narrow(0, offset_).zero_();
  const int64_t after = offset_ + n_;
  if (after < grads.numel()) grads.narrow(after, grads.numel() - after).zero_();
}

// Micro-step policy: this micro-step's gradient summed over ranks into this rank's slice, added
// to the window's, and the arena zeroed for the next micro-step.
void ZeroOptimizerState::micro_step_done() {
  if (!reduces_each_micro_step()) return;
  if (most_micro_ < 0) {
    throw std::logic_error("[zero] a micro-step outside a window (begin_window was not called)");
  }
  if (micro_done_ >= most_micro_) {
    throw std::logic_error(str_cat("[zero] micro-step ", micro_done_ + 1, " of a window planned ",
                                   "with at most ", most_micro_, " on any rank"));
  }
  optim::ParameterArena& arena = optimizer_.arena();
  reduce_scatter_in_place();
  backend_for(arena.device()).axpy(1.0, arena.grads().narrow(offset_, n_), accumulated_);
  arena.zero_grad();
  ++micro_done_;
}

void ZeroOptimizerState::finish() {
  optim::ParameterArena& arena = optimizer_.arena();
  if (stage_ == 1 && !arena.offloaded()) {
    // This rank's slice of the window gradient summed over ranks, in a buffer of its own.
    comm_.reduce_scatter(arena.grads(), optimizer_.slice_grads());
    arena.zero_grad();
  } else if (reduce_ == ZeroReduce::kBoundary) {
    // In place; the update (or the offload's copy) zeroes the slice, the rest is zeroed here.
    reduce_scatter_in_place();
    zero_outside_slice();
  } else {
    // The reduce-scatters of micro-steps other ranks ran and this one did not (a short window),
    // then the window's sum where the optimizer (or the offload's copy) reads it. The arena is
    // released once the update has read it.
    while (micro_done_ < most_micro_) micro_step_done();
    arena.grads().narrow(offset_, n_).copy_(accumulated_);
    accumulated_.zero_();
    most_micro_ = -1;
    release_after_update_ = true;
  }
}

bool ZeroOptimizerState::abandon() {
  // The micro-steps' partial sums; a slice of the arena is zeroed with it.
  if (accumulated_.defined()) accumulated_.zero_();
  Tensor& slice = optimizer_.slice_grads();
  if (slice.impl()->storage->held()) slice.zero_();
  most_micro_ = -1;
  return true;
}

void ZeroOptimizerState::after_update() {
  optim::ParameterArena& arena = optimizer_.arena();
  // In place. Offloaded, each rank's host keeps its slice of the masters alone.
  if (arena.masters_whole()) comm_.all_gather(arena.masters().narrow(offset_, n_), arena.masters());
  if (arena.working().defined()) {
    comm_.all_gather(arena.working().narrow(offset_, n_), arena.working());
  }
  if (release_after_update_) {
    arena.release_grads();
    release_after_update_ = false;
  }
}

}  // namespace accrue::distributed
