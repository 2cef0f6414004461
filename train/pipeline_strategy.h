// --pipeline P as a strategy: world rank r is stage r % P of pipeline group r / P, and the ranks
// of one stage are a data-parallel group (the next strategy spreads over them). The model's
// layers (Task::layers) are cut into contiguous stages of about equal parameter counts; a stage's
// arena holds its own layers; each window's micro-batches run through every stage under the
// schedule (distributed/pipeline.h), the last stage computing the losses; the stages' partial
// sums of squares make one gradient norm; a parameter tied across stages (the G2P head and its
// embedding) keeps a copy on the stage that borrows it, whose gradient goes to the owner at the
// boundary and which receives the update after it. Checkpoints live in a subfolder per stage.
// Read next: strategies.h.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/data_parallel.h"
#include "distributed/pipeline.h"
#include "distributed/stage_ops.h"
#include "train/strategy.h"

namespace accrue::train {

class PipelineStages final : public Strategy {
 public:
  explicit PipelineStages(const StrategyContext& ctx);
  std::string name() const override;

  distributed::Communicator& place(distributed::Communicator& ranks) override;
  std::string checkpoint_subfolder() const override;
  void check_resume_folder(const std::string& resume) const override;
  std::unique_ptr<optim::ParameterArena> make_arena(nn::Module& model) override;
  void place_parameters(nn::Module& model, optim::ParameterArena& arena) override;
  void attach(optim::Optimizer& optimizer) override;
  optim::GradientConsumer* gradients() override { return tied_.get(); }
  optim::PartialSumReducer* loss_reducer() override { return world_sum_.get(); }
  bool runs_windows() const override { return true; }
  nn::LossSum run_micro_batches(nn::Module& model, const WindowRun& run) override;
  void check_plan(const optim::ResolvedBatch& batch, int64_t epoch) const override;
  void gather_model(nn::Module& model) override;
  std::optional<std::vector<nn::NamedTensor>> whole_masters(optim::ParameterArena& arena,
                                                            nn::Module& model) override;
  void after_resume(int64_t step) override;
  void describe(nlohmann::json& run_config) const override;
  void report(Summary& summary, MetricsLog& metrics) override;

 private:
  std::vector<nn::NamedTensor> assign_stage(nn::Module& model);
  void check_layers_own_each_parameter_once(nn::Module& model) const;

  const Config& c_;
  Task& task_;
  DType compute_, master_;
  std::function<void(const std::string&)> log_;
  distributed::Communicator* world_ = nullptr;  // every rank of the job
  // This rank's stage, its group of stages and its layers; the sums over the stages (the norm's
  // partials) and over every rank (the boundary's loss sums); per-stage statistics.
  std::unique_ptr<distributed::Communicator> pipeline_group_, data_group_;
  std::optional<distributed::PipelineStage> stage_;
  std::vector<Layer> stage_layers_, all_layers_;
  std::vector<int> layer_stage_;                // the stage of each of all_layers_
  std::map<std::string, int> parameter_stage_;  // the stage owning each named parameter
  std::unique_ptr<distributed::GroupSum> stage_norm_sum_, world_sum_;
  std::unique_ptr<distributed::TiedParameters> tied_;  // parameters shared by two stages
  distributed::StageWindowStats totals_;  // summed over windows (max for in flight and peak)
  bool tied_copies_identical_ = true;
};

}  // namespace accrue::train
