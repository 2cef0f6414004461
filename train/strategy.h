// How training is spread over ranks. Each way is a Strategy (Lightning's `Strategy` is the
// precedent): data parallelism (the gradient all-reduce), ZeRO-1 (the sharded optimizer state),
// the offloaded optimizer, pipeline stages (distributed/, optim/ hold their machinery; these are
// the pieces that plug it into a run). A strategy says where the parameters and their masters
// live, which gradient consumer and loss reducer it brings, what it sets on the optimizer, how a
// window runs when it runs them itself, how the model is made whole for evaluation and saving,
// what a resume must match, and what it reports. The engine never asks which strategy runs: it
// calls the hooks of the composition (strategies.h), made in one place from one table of allowed
// combinations. A strategy of the user's own joins through Config::strategies. Read next:
// strategies.h.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/counting.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "optim/arena.h"
#include "optim/optimizer.h"
#include "optim/seams.h"
#include "optim/window.h"
#include "train/config.h"
#include "train/task.h"

namespace accrue::train {

struct Summary;
class MetricsLog;

// What a strategy is built with: the run's settings, its task, its dtypes and its log.
struct StrategyContext {
  const Config& config;
  Task& task;
  DType compute = DType::kFloat32, master = DType::kFloat32;
  std::function<void(const std::string&)> log;
};

// A window that a strategy runs itself (pipeline stages: every micro-batch through every stage
// at once; ZeRO-3: layer by layer): the plan's window, the epoch's sample order on the device,
// the backward seed (1 / N, or S / N: optim::Accumulator::pipelined_window) and the optimizer
// steps taken (dropout's key).
struct WindowRun {
  const optim::Window& window;
  const Tensor& order;
  const Tensor& seed;
  int64_t step;
  bool largest = false;  // --memory-budget's probe: Task::largest_samples, when the task has it
};

// What this rank holds for training after a step (the masters and the copy the model computes
// with, the gradient, the optimizer's state), and what it handed to the collectives, in bytes.
struct Footprint {
  size_t parameters = 0, gradients = 0, optimizer_state = 0;
  distributed::CollectiveBytes collectives;
  size_t model_state() const { return parameters + gradients + optimizer_state; }
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // A few words for the log: "data parallel: all-reduce over 2 ranks".
  virtual std::string name() const = 0;

  // Ranks, first: `ranks` are the ranks this strategy spreads over (every rank of the job for
  // the outermost); returns those the next one spreads over. Pipeline stages return the ranks
  // of this rank's stage; the others return `ranks`.
  virtual distributed::Communicator& place(distributed::Communicator& ranks) { return ranks; }
  // This rank's checkpoints live in this subfolder of --checkpoint ("" : the folder itself).
  virtual std::string checkpoint_subfolder() const { return ""; }
  // Before a resume: refuses a --resume folder written under another layout, naming it.
  virtual void check_resume_folder(const std::string& /*resume*/) const {}

  // The arena of the parameters this rank updates; null: every parameter of the model, unpadded.
  virtual std::unique_ptr<optim::ParameterArena> make_arena(nn::Module& /*model*/) {
    return nullptr;
  }
  // After the arena and its 16-bit working copy exist: where the masters and the other
  // parameters live (the host, a compute-dtype copy of another stage's layers).
  virtual void place_parameters(nn::Module& /*model*/, optim::ParameterArena& /*arena*/) {}
  // The optimizer exists: its seams (a sharded state, a partial-sum reducer, a parameter sync).
  virtual void attach(optim::Optimizer& /*optimizer*/) {}
  // The window's gradient and loss sums go through these (null: none of its own).
  virtual optim::GradientConsumer* gradients() { return nullptr; }
  virtual optim::PartialSumReducer* loss_reducer() { return nullptr; }
  // The bucket size when --bucket-kib is not given.
  virtual int64_t default_bucket_kib() const { return 0; }

  // Before each window's micro-steps (every rank, whether or not it has samples in it).
  virtual void begin_window(const optim::Window& /*window*/) {}
  // Whether a micro-step holds host work or collectives of its own (ZeRO-2's reduce-scatter at
  // every micro-step, ZeRO-3's gathers): no CUDA graph can hold it.
  virtual bool works_in_micro_steps() const { return false; }
  // Whether it runs each window itself (run_micro_batches) instead of the engine's micro-steps.
  virtual bool runs_windows() const { return false; }
  // Runs the window's micro-batches on this rank and returns the loss sum and item count of
  // those whose loss it computed (Accumulator::pipelined_window).
  virtual nn::LossSum run_micro_batches(nn::Module& model, const WindowRun& run);
  // sums += loss, for run_micro_batches: the loss and a count tensor on sums' device in `dtype`,
  // a host count on the host. No gradient flows through it.
  static void add_loss(const nn::LossSum& loss, DType dtype, nn::LossSum& sums);
  // Throws when an epoch's plan does not suit it (fewer micro-batches than stages).
  virtual void check_plan(const optim::ResolvedBatch& /*batch*/, int64_t /*epoch*/) const {}

  // Before the model is read whole (evaluation, saving, the final hash): collective.
  virtual void gather_model(nn::Module& /*model*/) {}
  // The master parameters of the whole model, in the model's order, when this rank's arena
  // holds only some (collective); nullopt: the arena's.
  virtual std::optional<std::vector<nn::NamedTensor>> whole_masters(optim::ParameterArena&,
                                                                    nn::Module&) {
    return std::nullopt;
  }
  // Whether every rank writes its own checkpoint (into checkpoint_subfolder()): its state is a
  // shard no other rank holds. Else the data-parallel group's first rank writes.
  virtual bool checkpoints_per_rank() const { return false; }
  // After the checkpoint's state was loaded at `step`.
  virtual void after_resume(int64_t /*step*/) {}
  // What a resume must match, added to the run's configuration.
  virtual void describe(nlohmann::json& /*run_config*/) const {}
  // At the end: lines for the log, records for the metrics, fields of the summary.
  virtual void report(Summary& /*summary*/, MetricsLog& /*metrics*/) {}
  // Its part of the summary's line (" | offloaded: ..."), after report().
  virtual std::string summary_part(const Summary& /*summary*/) const { return ""; }
  // The bytes it handed to the collectives (added up over the composition).
  virtual distributed::CollectiveBytes collective_bytes() const { return {}; }
  // Parameter and gradient bytes it holds beyond the arena's and the optimizer's (ZeRO-2's
  // micro-step sum, ZeRO-3's gathered layers); collectives unused.
  virtual Footprint held_beyond_arena() const { return {}; }
};

// A strategy over the ranks the one before it left, which it talks to through a counter of the
// bytes it hands the collectives (distributed/counting.h): data parallelism and the ZeRO stages.
class OverRanks : public Strategy {
 public:
  distributed::Communicator& place(distributed::Communicator& ranks) override {
    counted_ = std::make_unique<distributed::CountingCommunicator>(ranks);
    ranks_ = counted_.get();
    return ranks;
  }
  distributed::CollectiveBytes collective_bytes() const override {
    return counted_ ? counted_->bytes() : distributed::CollectiveBytes{};
  }

 protected:
  distributed::Communicator* ranks_ = nullptr;

 private:
  std::unique_ptr<distributed::CountingCommunicator> counted_;
};

}  // namespace accrue::train
