// The strategies of a run, composed in one place from one table. From the outermost in:
//   pipeline stages (--pipeline P > 1)    pipeline_strategy.h
//   ZeRO-1, 2 (--zero 1, 2)               each rank updates one shard (distributed/zero.h)
//   ZeRO-3 (--zero 3)                      the parameters sharded too (zero3_strategy.h)
//   or data parallel (several ranks)      the gradient all-reduce (distributed/data_parallel.h)
//   the offloaded optimizer               masters and state on the host (optim/offload.h)
//   the user's own (Config::strategies)
// Each spreads over the ranks the one before it leaves (a pipeline leaves each stage's ranks).
// The composition calls every hook in that order: the gradient goes to the consumers in turn
// (the first takes the buckets during backward, then each finishes at the boundary: a tied
// copy's gradient to its owner, the sum over the ranks, the copy to the host); the loss sums go
// to the outermost reducer (it spans every rank that holds a loss); at most one strategy makes
// the arena. The table below says which combine; the flags ask it before any data is read.
// Read next: engine.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "optim/offload.h"
#include "train/strategy.h"

namespace accrue::train {

// Throws ValueError naming both flags when the run combines two strategies (or a strategy and
// a setting) that the table marks as not combining.
void check_strategies(const Config& config);

class Strategies {
 public:
  explicit Strategies(const StrategyContext& ctx);
  ~Strategies();
  Strategies(const Strategies&) = delete;
  Strategies& operator=(const Strategies&) = delete;

  // Places every strategy, outermost first, and returns the ranks that share one copy of the
  // parameters: the data-parallel ranks the window plan splits each window over.
  distributed::Communicator& place(distributed::Communicator& world);
  std::string names() const;  // "pipeline: 2 stages, 1f1b; data parallel over 2 ranks"
  std::string checkpoint_subfolder() const;
  void check_resume_folder(const std::string& resume) const;

  std::unique_ptr<optim::ParameterArena> make_arena(nn::Module& model);
  void place_parameters(nn::Module& model, optim::ParameterArena& arena);
  void attach(optim::Optimizer& optimizer);
  optim::GradientConsumer* gradients() { return gradients_; }
  optim::PartialSumReducer* loss_reducer();
  int64_t default_bucket_kib() const;

  void begin_window(const optim::Window& window);
  bool works_in_micro_steps() const;
  bool checkpoints_per_rank() const;
  // The strategy that runs each window itself, or null: the engine's micro-steps.
  Strategy* window_runner() const;
  void check_plan(const optim::ResolvedBatch& batch, int64_t epoch) const;

  void gather_model(nn::Module& model);
  std::vector<nn::NamedTensor> whole_masters(optim::ParameterArena& arena, nn::Module& model);
  void after_resume(int64_t step);
  void describe(nlohmann::json& run_config) const;
  void report(Summary& summary, MetricsLog& metrics);
  std::string summary_part(const Summary& summary) const;
  Footprint footprint(const optim::ParameterArena& arena, const optim::Optimizer& optimizer) const;

 private:
  StrategyContext ctx_;
  std::vector<std::shared_ptr<Strategy>> list_;  // outermost first
  std::vector<std::unique_ptr<optim::GradientConsumer>> chains_;
  optim::GradientConsumer* gradients_ = nullptr;
};

}  // namespace accrue::train
