// The schedules as lists of actions, their simulation on paper, and one stage's run of a window
// (see pipeline.h).
#include "distributed/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>

#include "core/allocator.h"
#include "core/clock.h"
#include "core/error.h"
#include "distributed/stage_ops.h"
#include "ops/autograd.h"

namespace accrue::distributed {
namespace {

void check_layout(const char* op, int stages, int stage, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1) {
    throw ValueError(str_cat("[", op, "] stage ", stage, " of ", stages, " stages, ", micro_batches,
                             " micro-batches: needs 0 <= stage < stages and at "
                             "least one micro-batch"));
  }
}

}  // namespace

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::kGPipe;
  if (name == "1f1b") return PipelineSchedule::kOneFOneB;
  throw ValueError(str_cat("[pipeline] schedule '", name, "': choose gpipe or 1f1b"));
}

const char* schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGPipe ? "gpipe" : "1f1b";
}

std::vector<PipelineAction> schedule_actions(PipelineSchedule schedule, int stages, int stage,
                                             int micro_batches) {
  check_layout("schedule_actions", stages, stage, micro_batches);
  std::vector<PipelineAction> actions;
  actions.reserve(2 * static_cast<size_t>(micro_batches));
  // GPipe is 1F1B with every forward in the warm-up.
  const int warm_up = schedule == PipelineSchedule::kGPipe
                          ? micro_batches
                          : std::min(stages - 1 - stage, micro_batches);
  for (int m = 0; m < warm_up; ++m) actions.push_back({true, m});
  for (int m = warm_up; m < micro_batches; ++m) {
    actions.push_back({true, m});
    actions.push_back({false, m - warm_up});
  }
  for (int m = micro_batches - warm_up; m < micro_batches; ++m) actions.push_back({false, m});
  return actions;
}

int max_in_flight(const std::vector<PipelineAction>& actions) {
  int now = 0, most = 0;
  for (const PipelineAction& a : actions) {
    now += a.forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

SimulatedPipeline simulate_pipeline(PipelineSchedule schedule, int stages, int micro_batches,
                                    double forward_cost, double backward_cost) {
  check_layout("simulate_pipeline", stages, 0, micro_batches);
  std::vector<std::vector<PipelineAction>> actions(stages);
  for (int s = 0; s < stages; ++s)
    actions[s] = schedule_actions(schedule, stages, s, micro_batches);
  return simulate_pipeline(actions, forward_cost, backward_cost);
}

SimulatedPipeline simulate_pipeline(const std::vector<std::vector<PipelineAction>>& actions,
                                    double forward_cost, double backward_cost) {
  const int stages = static_cast<int>(actions.size());
  const int micro_batches = stages > 0 ? static_cast<int>(actions[0].size() / 2) : 0;
  check_layout("simulate_pipeline", stages, 0, micro_batches);
  for (int s = 0; s < stages; ++s) {
    std::vector<int> seen(2 * static_cast<size_t>(micro_batches), 0);
    bool valid = actions[s].size() == seen.size();
    for (const PipelineAction& a : actions[s]) {
      valid = valid && a.micro >= 0 && a.micro < micro_batches &&
              ++seen[2 * static_cast<size_t>(a.micro) + (a.forward ? 0 : 1)] == 1;
    }
    if (!valid) {
      throw ValueError(str_cat("[simulate_pipeline] stage ", s, " must run each of ", micro_batches,
                               " micro-batches once forward and once backward"));
    }
  }
  constexpr double kNotYet = std::numeric_limits<double>::infinity();
  // When stage s finished micro-batch m's forward / backward.
  std::vector<std::vector<double>> forward_done(stages,
                                                std::vector<double>(micro_batches, kNotYet));
  auto backward_done = forward_done;
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0), busy(stages, 0);
  size_t remaining = 2 * static_cast<size_t>(stages) * micro_batches;
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < actions[s].size()) {
        const PipelineAction a = actions[s][next[s]];
        // What this action needs: the neighbour's part, and a backward its own forward.
        double ready = 0;
        if (a.forward && s > 0) ready = forward_done[s - 1][a.micro];
        if (!a.forward) {
          ready = s < stages - 1 ? std::max(backward_done[s + 1][a.micro], forward_done[s][a.micro])
                                 : forward_done[s][a.micro];
        }
        if (ready == kNotYet) break;
        const double cost = a.forward ? forward_cost : backward_cost;
        const double start = std::max(free_at[s], ready);
        free_at[s] = start + cost;
        busy[s] += cost;
        (a.forward ? forward_done : backward_done)[s][a.micro] = free_at[s];
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      throw ValueError(str_cat("[simulate_pipeline] the schedule deadlocks: with ", stages,
                               " stages and ", micro_batches, " micro-batches, ", remaining,
                               " actions wait for actions that never come"));
    }
  }
  SimulatedPipeline out;
  out.makespan = *std::max_element(free_at.begin(), free_at.end());
  for (int s = 0; s < stages; ++s) out.idle_fraction.push_back(1 - busy[s] / out.makespan);
  return out;
}

std::vector<int> balance_stages(const std::vector<int64_t>& sizes, int stages) {
  const int layers = static_cast<int>(sizes.size());
  if (stages < 1 || layers < stages) {
    throw ValueError(str_cat("[pipeline] ", stages,
                             " stages need at least as many layers; the "
                             "model has ",
                             layers));
  }
  int64_t total = 0;
  for (const int64_t n : sizes) total += n;
  std::vector<int> stage_of(sizes.size());
  int stage = 0, in_stage = 0;
  int64_t running = 0;
  for (int i = 0; i < layers; ++i) {
    // Move on from a stage that has a layer when the layers left are just enough for the stages
    // after it, or when this layer would take it past its share by more than half the layer.
    const bool needed = layers - i == stages - 1 - stage;
    const bool has_share = running + sizes[i] / 2 > total * (stage + 1) / stages;
    if (stage < stages - 1 && in_stage > 0 && (needed || has_share)) {
      ++stage;
      in_stage = 0;
    }
    stage_of[i] = stage;
    ++in_stage;
    running += sizes[i];
  }
  return stage_of;
}

PipelineStage::PipelineStage(Communicator& group, DType activations, Device device)
    : group_(group), activations_(activations), device_(device) {}

StageWindowStats PipelineStage::run_schedule(PipelineSchedule schedule, int micro_batches,
                                             const Tensor& seed, const Functions& functions) {
  if (!grad_enabled()) {
    throw AutogradError("[pipeline] run_schedule trains: it needs grad enabled (no NoGradGuard)");
  }
  if ((first() && !functions.input) || !functions.forward || (last() && !functions.loss)) {
    throw ValueError(str_cat("[pipeline] stage ", stage(), " of ", stages(), " needs ",
                             first() ? "input, " : "", "forward", last() ? " and loss" : ""));
  }
  const auto start = std::chrono::steady_clock::now();
  CachingAllocator& alloc = allocator_for(device_);
  const size_t before = alloc.stats().live_bytes;
  alloc.reset_peak();
  StageWindowStats stats;
  // Micro-batch m's tape and the tensor its backward starts from (the last stage's loss, or the
  // token of the activation sent on), alive from its forward to its backward.
  std::vector<std::unique_ptr<Tape>> tapes(micro_batches);
  std::vector<Tensor> roots(micro_batches);
  int in_flight = 0;
  for (const PipelineAction& a : schedule_actions(schedule, stages(), stage(), micro_batches)) {
    const int m = a.micro;
    const auto action_start = std::chrono::steady_clock::now();
    const double waited_before = boundary_wait_seconds();
    if (a.forward) {
      tapes[m] = std::make_unique<Tape>();
      const TapeScope scope(*tapes[m]);
      const Tensor x = first() ? functions.input(m)
                               : recv_activation(stage() - 1, m, activations_, device_, group_);
      const Tensor y = functions.forward(x, m);
      if (last()) {
        roots[m] = functions.loss(y, m);
      } else {
        roots[m] = send_activation(y, stage() + 1, m, group_);
      }
      stats.max_in_flight = std::max(stats.max_in_flight, ++in_flight);
    } else {
      {
        const TapeScope scope(*tapes[m]);
        // The last stage seeds its loss; another stage starts from the token of the activation
        // it sent, whose node waits for that activation's gradient from the next stage.
        if (last()) {
          backward(roots[m], seed.view(roots[m].shape()));
        } else {
          backward(roots[m]);
        }
      }
      roots[m] = Tensor();
      tapes[m].reset();  // empty after backward; its activations are back in the pool
      --in_flight;
    }
    const double waited = boundary_wait_seconds() - waited_before;
    stats.wait_seconds += waited;
    stats.busy_seconds += seconds_since(action_start) - waited;
  }
  stats.peak_activation_bytes = alloc.stats().peak_bytes - before;
  stats.seconds = seconds_since(start);
  return stats;
}

TiedParameters::TiedParameters(Communicator& group, std::vector<Tie> ties)
    : group_(group), ties_(std::move(ties)) {
  for (const Tie& t : ties_) {
    if (t.owner == t.user || t.owner < 0 || t.user < 0 || t.owner >= group.world_size() ||
        t.user >= group.world_size()) {
      throw ValueError(str_cat("[TiedParameters] owner stage ", t.owner, " and user stage ", t.user,
                               " must be two stages of ", group.world_size()));
    }
  }
}

void TiedParameters::finish() {
  const int stage = group_.rank();
  for (Tie& t : ties_) {
    // The owner's gradient is its arena's view, summed into in place; the other stages add
    // zeros, the user its copy's gradient.
    Tensor grad = t.param.grad();
    if (stage != t.owner && (stage != t.user || !grad.defined())) {
      grad = Tensor::zeros(t.param.shape(), t.gradient_dtype, t.param.device());
    }
    group_.all_reduce_sum(grad);
    if (stage == t.user && t.param.grad().defined()) t.param.grad().zero_();
  }
}

bool TiedParameters::abandon() {
  for (Tie& t : ties_) {
    if (group_.rank() == t.user && t.param.grad().defined()) t.param.grad().zero_();
  }
  return true;
}

void TiedParameters::after_update() {
  for (Tie& t : ties_) group_.broadcast(t.param, t.owner);
}

bool TiedParameters::uses(const Tensor& t) const {
  for (const Tie& tie : ties_) {
    if (tie.param.impl() == t.impl()) return true;
  }
  return false;
}

bool TiedParameters::copies_identical() {
  double differing = 0;
  for (Tie& t : ties_) {
    Tensor owners = t.param.clone();
    group_.broadcast(owners, t.owner);
    if (group_.rank() == t.user) {
      const Tensor mine = t.param.to(Device::cpu()), theirs = owners.to(Device::cpu());
      differing += std::memcmp(mine.raw(), theirs.raw(), mine.nbytes()) != 0;
    }
  }
  Tensor total = Tensor::from_vector<double>({1}, {differing});
  group_.all_reduce_sum(total);
  return total.item() == 0;
}

}  // namespace accrue::distributed
