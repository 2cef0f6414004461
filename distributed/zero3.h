// ZeRO stage 3 (FSDP's "full shard"): the parameters are sharded too. The model's layers are cut
// into units (one per layer of Task::layers, its own parameters flattened), each padded to N
// equal slices; rank r keeps slice r of every unit, and those slices are what its arena holds
// (masters, the 16-bit working copy, gradients, optimizer state: Psi / N each). A unit's
// parameters exist whole only around its use:
//   forward   before layer i: its units all-gathered (the working copy, in 16 bits when there is
//             one); after it: released unless layer i + 1 uses them;
//   backward  a recorded identity at each layer's output (mark()) runs before that layer's
//             backward: the units whose last use was layer i + 1 are reduce-scattered (their
//             gradient, summed over the ranks, added to this rank's slice) and released, and
//             layer i's units are gathered again, with a zeroed gradient buffer; after the
//             backward (after_backward) the rest is reduce-scattered. Layers whose output needs
//             no gradient (a first layer without parameters) record no mark: after_backward
//             takes their steps, so every unit is reduce-scattered and every rank runs the
//             collectives phantom_micro_step() runs.
// The prefetch (ZeroPrefetch) starts a gather a layer ahead, so it runs while this layer
// computes (Communicator::start_all_gather: a side stream under NCCL): in the forward, the next
// layer's units before this layer's forward, holding two layers' parameters as the backward
// already does (one layer's parameters and gradient); with kForwardAndBackward also the lower
// layer's before this one's backward, holding a third. Without it each gather is on demand.
// So k micro-steps cost 2k gathers of every unit and k reduce-scatters a window. A unit that a
// later layer borrows (the G2P head tied to the token embedding) is gathered for each use and
// reduce-scattered once, after its earliest layer's backward. The memory comes and goes through
// Storage::release() and reacquire(), so the views the tape saved stay valid. A rank with fewer
// micro-batches in a short window runs the same collectives (phantom_micro_step()). Read next:
// train/zero3_strategy.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/zero.h"
#include "nn/module.h"
#include "optim/arena.h"

namespace accrue::distributed {

class ShardedLayers {
 public:
  struct Unit {
    std::string name;            // the layer's ("h.0")
    std::vector<Tensor> params;  // its own parameters, in the model's order
  };
  // units[u] is layer u's; uses[i] lists the units layer i computes with (its own and those it
  // borrows). Every parameter of the model must belong to exactly one unit (throws ValueError
  // naming it otherwise). compute: the dtype the model computes in (the 16-bit working copy's,
  // or the masters').
  ShardedLayers(std::vector<Unit> units, std::vector<std::vector<int>> uses,
                const std::vector<nn::NamedTensor>& model_parameters, Communicator& comm,
                DType master, DType compute, Device device,
                ZeroPrefetch prefetch = ZeroPrefetch::kNone);
  ~ShardedLayers();
  ShardedLayers(const ShardedLayers&) = delete;
  ShardedLayers& operator=(const ShardedLayers&) = delete;

  // This rank's slice of each unit's values, named "zero3/<unit>": what the arena holds.
  std::vector<nn::NamedTensor> shards() const;
  // After the arena took the shards (and its working copy exists): the model's parameters view
  // the units' buffers, held with their values until the first window releases them, and their
  // gradients view the units' gradient buffers.
  void bind(optim::ParameterArena& arena);

  // The schedule of one micro-step (see the top of this file).
  // Releases every unit and gradient buffer: each window starts from the shards alone (and a
  // resume's or an abandoned window's leftovers go).
  void begin_window();
  void before_forward(int layer);
  void after_forward(int layer);
  Tensor mark(const Tensor& output, int layer);  // identity; its backward: before_backward
  void before_backward(int layer);
  void after_backward();
  // The collectives of a micro-step this rank does not have (zeros reduce-scattered).
  void phantom_micro_step();

  // Every unit gathered (evaluation, saving): collective.
  void gather_all();
  // The whole masters of the model, in its order (collective).
  std::vector<nn::NamedTensor> whole_masters();
  // Bytes the units hold now: gathered parameters, and gradient buffers.
  size_t held_parameter_bytes() const;
  size_t held_gradient_bytes() const;
  int layers() const { return static_cast<int>(uses_.size()); }

 private:
  struct Placed;
  void gather(int unit);        // completes the unit's started gather, or gathers it now
  void start_gather(int unit);  // unless the unit is held or on its way
  void gather_into_buffer(int unit, bool ahead);
  void start_gathers(int layer);
  void release(int unit);
  void reduce_scatter(int unit);

  Communicator& comm_;
  DType master_, compute_;
  Device device_;
  ZeroPrefetch prefetch_;
  optim::ParameterArena* arena_ = nullptr;
  std::vector<std::vector<int>> uses_;
  std::vector<int> last_use_;  // the lowest layer using each unit: where its backward ends
  int backward_reached_ = 0;   // the lowest layer whose before_backward ran this micro-step
  std::vector<std::unique_ptr<Placed>> units_;
  std::vector<std::unique_ptr<Transfer>> started_;  // per unit: its gather started ahead
  std::vector<std::pair<std::string, const TensorImpl*>> order_;  // the model's parameters
};

}  // namespace accrue::distributed
