// Pipeline parallelism: a model cut into P contiguous stages on P ranks, and the k micro-batches
// of a window scheduled through them (the articles' GPipe). Each stage keeps a tape per
// micro-batch in flight (ops/autograd.h Tape), sends its output to the next stage and receives
// gradients back through the recorded ops of stage_ops.h, and accumulates its own parameters'
// gradients over the window in their persistent buffers: after the window the stages together
// hold exactly the gradient one process would have, and each runs the boundary step on its part.
//
// Two schedules, as lists of actions per stage:
//   GPipe: every forward of the window, then every backward (k micro-batches in flight);
//   1F1B:  P - 1 - s warm-up forwards on stage s, then one forward and one backward in turn,
//          then the drain (at most P - s micro-batches in flight on stage s).
// Both leave each stage with the same gradient; the bubble, the idle share of each stage, is
// (P - 1) / (k + P - 1) for both when forward and backward take equal time, which is why a
// larger k shrinks it. simulate_pipeline() works a schedule out on paper; PipelineStage runs it.
// Read next: pipeline.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/communicator.h"
#include "optim/seams.h"

namespace accrue::distributed {

enum class PipelineSchedule { kGPipe, kOneFOneB };
// "gpipe" or "1f1b"; anything else throws ValueError naming the choices.
PipelineSchedule parse_pipeline_schedule(const std::string& name);
const char* schedule_name(PipelineSchedule schedule);

struct PipelineAction {
  bool forward = true;  // else backward
  int micro = 0;        // the micro-batch, 0 .. k - 1
  bool operator==(const PipelineAction& o) const {
    return forward == o.forward && micro == o.micro;
  }
};

// Stage `stage`'s actions for a window of k micro-batches over `stages` stages (k >= 1; a short
// last window may have k < P). Forwards and backwards each in micro-batch order.
std::vector<PipelineAction> schedule_actions(PipelineSchedule schedule, int stages, int stage,
                                             int micro_batches);

// The most micro-batches whose forward has run and backward has not, over the actions.
int max_in_flight(const std::vector<PipelineAction>& actions);

// A schedule run on paper: every forward takes forward_cost, every backward backward_cost, a
// stage runs its actions in order, and an action waits for its input from the neighbouring
// stage (forward m on stage s after forward m on s - 1; backward m after backward m on s + 1).
struct SimulatedPipeline {
  double makespan = 0;
  std::vector<double> idle_fraction;  // per stage: 1 - busy / makespan
};
// Throws if the schedule deadlocks (a stage waits for an action that never comes).
SimulatedPipeline simulate_pipeline(PipelineSchedule schedule, int stages, int micro_batches,
                                    double forward_cost = 1, double backward_cost = 1);
// The same for any actions, one list per stage (each micro-batch once forward, once backward).
SimulatedPipeline simulate_pipeline(const std::vector<std::vector<PipelineAction>>& actions,
                                    double forward_cost = 1, double backward_cost = 1);

// The stage of each layer, given the layers' parameter counts in order: contiguous runs, a cut
// where the running count passes each stage's equal share, every stage at least one layer
// (needs at least `stages` layers; throws ValueError otherwise).
std::vector<int> balance_stages(const std::vector<int64_t>& sizes, int stages);

// What a window did on one stage.
struct StageWindowStats {
  int max_in_flight = 0;             // micro-batches with activations held at once
  size_t peak_activation_bytes = 0;  // live bytes above the window's start, at the highest
  double busy_seconds = 0;           // computing (forward, backward)
  double wait_seconds = 0;           // waiting for a neighbour's activation
  double seconds = 0;                // the whole window
};

// One stage of a pipeline: rank `stage` of `group` (the pipeline group, one rank per stage).
class PipelineStage {
 public:
  struct Functions {
    // First stage only: micro-batch m's input.
    std::function<Tensor(int micro)> input;
    // This stage's layers on x (the input, or the previous stage's activation).
    std::function<Tensor(const Tensor& x, int micro)> forward;
    // Last stage only: the one-element tensor backward starts from (micro-batch m's loss sum),
    // given the stage's output y. Its backward is seeded with the window's `seed`.
    std::function<Tensor(const Tensor& y, int micro)> loss;
  };
  // activations: the dtype the stages exchange (the run's compute dtype), on `device`.
  PipelineStage(Communicator& group, DType activations, Device device);
  int stage() const { return group_.rank(); }
  int stages() const { return group_.world_size(); }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }

  // Runs the window's k micro-batches through this stage under `schedule`: gradients accumulate
  // into the parameters' buffers; every tape is empty afterwards. Every stage calls it with the
  // same schedule and k. seed: one element, the last stage's backward seed (1 / the window's
  // items; optim::Accumulator::pipelined_window hands it over). Returns the window's statistics.
  StageWindowStats run_schedule(PipelineSchedule schedule, int micro_batches, const Tensor& seed,
                                const Functions& functions);

 private:
  Communicator& group_;
  DType activations_;
  Device device_;
};

// A parameter two stages use (the embedding and the head tied to it): the owner's arena holds
// it, the user keeps a copy outside its arena. At the boundary, before the norm (so the matrix is
// counted once, in the owner's arena), the user's gradient is summed into the owner's over the
// pipeline group; after the update the owner's values are broadcast back to the user. Every stage
// of the group takes part in both. Plug in as a GradientConsumer before the data-parallel
// all-reduce (which then sums the owner's whole gradient over the replicas) and as the
// optimizer's ParameterSync.
class TiedParameters : public optim::GradientConsumer, public optim::ParameterSync {
 public:
  struct Tie {
    Tensor param;  // this rank's tensor (the owner's arena parameter, or the user's copy)
    int owner = 0, user = 0;                 // stages
    DType gradient_dtype = DType::kFloat32;  // the masters' (the owner's arena gradient)
  };
  TiedParameters(Communicator& group, std::vector<Tie> ties);
  void ready(int64_t, int64_t) override {}
  void finish() override;
  bool abandon() override;  // the user's gradient is dropped with the window
  void after_update() override;
  // Collective over the group: whether every user's copy equals its owner's values bit for bit.
  bool copies_identical();
  // Whether t is the tensor of one of the ties on this rank.
  bool uses(const Tensor& t) const;

 private:
  Communicator& group_;
  std::vector<Tie> ties_;
};

}  // namespace accrue::distributed
