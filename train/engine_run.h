// The training engine's run (engine.h's train()), one object holding a run's state, its member
// functions split over files by concern: engine.cpp the flow (ranks, data, model, optimizer,
// epochs, the end), engine_checkpoint.cpp what a resume must match and the checkpoints,
// engine_window.cpp a window's micro-steps on the device path, engine_report.cpp the step and
// epoch records and the summary. Internal to train/: include engine.h. Read next: engine.cpp.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/staging.h"
#include "core/threads.h"
#include "optim/accumulator.h"
#include "optim/schedule.h"
#include "train/budget.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "train/progress.h"
#include "train/report.h"
#include "train/step_graphs.h"
#include "train/strategies.h"

namespace accrue::train::engine {

// What --save, --resume and a checkpoint's model part hold: the master parameters, then the
// model's buffers.
inline std::vector<nn::NamedTensor> with_buffers(std::vector<nn::NamedTensor> masters,
                                                 const nn::Module& model) {
  for (auto& b : model.named_buffers()) masters.push_back(b);
  return masters;
}

// The tensors' bytes together.
inline size_t bytes_of(const std::vector<nn::NamedTensor>& tensors) {
  size_t bytes = 0;
  for (const auto& [name, t] : tensors) bytes += t.nbytes();
  return bytes;
}

// An epoch's batch: its resolved sizes, its windows and its learning rate (before the schedule).
struct EpochPlan {
  optim::ResolvedBatch batch;
  std::vector<optim::Window> windows;
  double lr;
};

class Run {
 public:
  Run(const Config& config, Task& task, std::ostream& out, const Callbacks& callbacks)
      : c_(config), task_(task), out_(out), callbacks_(callbacks) {}
  Summary train();

 private:
  // A message on a line of its own (a progress line drawn in place is ended first).
  void log(const std::string& line) const {
    if (c_.quiet) return;
    if (progress_) progress_->clear();
    out_ << line << "\n";
  }
  void setup_ranks_and_threads();
  void build_model();
  void check_ranks_agree_before_training();
  void fit_memory_budget();
  const EpochPlan& plan_for(int64_t epoch);
  void build_optimizer();
  void build_accumulator();
  nlohmann::ordered_json recipe() const;
  nlohmann::json run_config();
  void resume();
  void check_same_horizon(const Checkpoint& saved) const;
  void carry_best_weights();
  void validate_position(const Checkpoint& saved);
  void write_weights(const std::string& path, const std::vector<nn::NamedTensor>& masters,
                     const std::map<std::string, std::string>& extra = {});
  void save_weights(const std::string& path, const std::vector<nn::NamedTensor>& masters);
  void write_checkpoint(const TrainPosition& position);
  void wait_for_the_lead(size_t bytes);
  void broadcast_buffers();
  void run_epoch(int64_t epoch);
  int64_t items_in(const std::vector<int32_t>& order, int64_t start, int64_t count) const;
  [[noreturn]] void stop(const optim::StepResult& last);
  void report_step(const optim::StepResult& r, const EpochPlan& plan, int64_t epoch,
                   int64_t samples, int64_t tokens, double seconds);
  void order_shares_by_length(const EpochPlan& plan, std::vector<int32_t>& order) const;
  int64_t tokens_of(const optim::Window& w, const std::vector<int32_t>& order) const;
  // final: the run's last epoch (Task::evaluate_final).
  void end_epoch(int64_t epoch, double epoch_loss, int64_t epoch_items, double epoch_seconds,
                 bool final);
  optim::StepResult run_window(const optim::Window& w, const Tensor& order,
                               const std::vector<int32_t>& order_host);
  optim::StepResult run_window_once(const optim::Window& w, const Tensor& order,
                                    const std::vector<int32_t>& order_host);
  void run_micro_steps(const optim::Window& w, const Tensor& order,
                       const std::vector<int32_t>& order_host);
  void setup_device_path();
  std::string batch_text(const optim::ResolvedBatch& batch) const;
  Evaluation measure(const std::function<Evaluation(nn::Module&)>& measure);
  Evaluation evaluate(bool final);
  // engine_best.cpp: --eval-every, --keep-best, --early-stop.
  void check_best_can_be_chosen() const;
  bool chooses_best() const;
  Evaluation held_out_evaluation();
  void evaluate_between_steps(int64_t epoch, int64_t step);
  std::string consider_for_best(const Evaluation& e, int64_t step);
  std::string best_weights_path() const;
  void write_best_weights(const Evaluation& e, int64_t step);
  std::string best_text() const;
  void finish();
  void refuse_a_run_without_gradient() const;
  void report_summary();
  void fill_summary();
  std::string summary_line();
  nlohmann::json summary_record();
  std::string collectives_text() const;
  std::string device_path_line() const;

  Config c_;
  Task& task_;
  std::ostream& out_;
  const Callbacks& callbacks_;
  distributed::Communicator* comm_ = nullptr;   // the data-parallel ranks (of this stage)
  distributed::Communicator* world_ = nullptr;  // every rank of the job
  bool lead_ = true;
  // Checkpoints: where this rank's are written and read (a stage's subfolder with --pipeline),
  // and whether it writes them (the first data-parallel rank of its stage).
  std::string checkpoint_dir_, resume_dir_;
  bool writes_checkpoints_ = true;
  // How training is spread over the ranks (strategies.h): everything of data parallelism,
  // ZeRO, offloading and pipeline stages lives there.
  std::unique_ptr<Strategies> strategies_;
  std::optional<ThreadTuner> tuner_;
  DType compute_ = DType::kFloat32, master_ = DType::kFloat32;
  LossScalePlan scaling_;
  int64_t train_samples_ = 0;
  size_t device_bytes_before_ = 0, host_bytes_before_ = 0;
  std::unique_ptr<nn::Module> model_;
  std::unique_ptr<optim::ParameterArena> arena_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::optional<BudgetDecision> budget_;
  std::optional<optim::AccumSchedule> k_schedule_;
  std::map<int64_t, EpochPlan> plans_;  // by k
  std::unique_ptr<optim::Accumulator> acc_;
  // The device path: host-built micro-batches staged one ahead (Task::host_samples), and the
  // micro-steps' CUDA graphs (--cuda-graphs).
  std::unique_ptr<HostToDevice> stager_;
  std::unique_ptr<StepGraphs> graphs_;
  GraphCounts graph_counts_;  // of graphs that were given up
  int64_t total_steps_ = 0;
  nlohmann::json run_config_;
  TrainPosition start_, position_;
  int64_t last_checkpoint_ = -1;
  std::optional<CheckpointLock> checkpoint_lock_;  // rank 0 with --checkpoint
  std::string run_id_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<Progress> progress_;
  Summary summary_;
  int64_t samples_seen_ = 0;  // since step 0, the windows before a resume included
  // By this process (not before a resume), every rank.
  int64_t samples_trained_ = 0, tokens_trained_ = 0;
  // This process's steps whose gradient was finite and not zero everywhere, and those whose was
  // zero (a loss scale that underflows every gradient, a loss that does not depend on the
  // weights).
  int64_t steps_with_gradient_ = 0, steps_without_gradient_ = 0;
  // The best held-out evaluation so far (in every checkpoint), its label and format, the step
  // last compared with it, and whether --early-stop has ended the run.
  BestSoFar best_;
  Evaluation best_measure_;
  // --keep-best: the best's weights are in best_weights_path() (this run wrote them, or the
  // resume found them there or carried them there).
  bool best_weights_kept_ = false;
  int64_t last_considered_step_ = -1;
  bool stopping_early_ = false;
};

}  // namespace accrue::train::engine
