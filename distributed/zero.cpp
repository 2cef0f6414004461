// ZeRO stage 1 (see zero.h).
#include "distributed/zero.h"

#include "core/error.h"

namespace accrue::distributed {

ZeroOptimizerState::ZeroOptimizerState(optim::Optimizer& optimizer, Communicator& comm)
    : optimizer_(optimizer), comm_(comm) {
  optim::ParameterArena& arena = optimizer.arena();
  const int64_t world = comm.world_size();
  if (arena.size() % world != 0) {
    throw ValueError(str_cat("[zero] an arena of ", arena.size(), " elements does not split ",
                             "into ", world, " equal shards; build it with ParameterArena(module, ",
                             world, ")"));
  }
  const int64_t n = arena.size() / world;
  optimizer.restrict_to_slice(comm.rank() * n, n);
  optimizer.set_partial_sum_reducer(this);
  optimizer.set_parameter_sync(this);
  optimizer.set_slice_gather(this);
}

void ZeroOptimizerState::ready(int64_t, int64_t) {
  throw ValueError(
      "[zero] the sharded optimizer (--zero 1) reduce-scatters the gradient at the boundary; it "
      "does not combine with all-reduce buckets during backward (--bucket-kib)");
}

void ZeroOptimizerState::finish() {
  // This rank's slice of the window gradient summed over ranks.
  optim::ParameterArena& arena = optimizer_.arena();
  comm_.reduce_scatter(arena.grads(), optimizer_.slice_grads());
  arena.zero_grad();
}

void ZeroOptimizerState::after_update() {
  optim::ParameterArena& arena = optimizer_.arena();
  const int64_t n = arena.size() / comm_.world_size();
  const int64_t offset = comm_.rank() * n;
  comm_.all_gather(arena.masters().narrow(offset, n), arena.masters());  // in place
  if (arena.working().defined()) {
    comm_.all_gather(arena.working().narrow(offset, n), arena.working());
  }
}

}  // namespace accrue::distributed
