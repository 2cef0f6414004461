// Pipeline stages as a strategy (pipeline_strategy.h).
#include "train/pipeline_strategy.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>
#include <unordered_set>

#include "kernels/backend.h"
#include "kernels/factories.h"
#include "nn/norm.h"
#include "ops/autograd.h"
#include "train/agreement.h"
#include "train/engine.h"
#include "train/report.h"

namespace accrue::train {

namespace {

// The parameters a pipeline layer owns: those of its modules.
std::vector<Tensor> layer_parameters(const Layer& layer) {
  std::vector<Tensor> out;
  for (nn::Module* m : layer.modules) {
    for (const Tensor& p : m->parameters()) out.push_back(p);
  }
  return out;
}

}  // namespace

PipelineStages::PipelineStages(const StrategyContext& ctx)
    : c_(ctx.config), task_(ctx.task), compute_(ctx.compute), master_(ctx.master), log_(ctx.log) {}

std::string PipelineStages::name() const {
  return str_cat("pipeline: ", c_.pipeline, " stages, ",
                 distributed::schedule_name(c_.pipeline_schedule));
}

// World rank r is stage r % P of the pipeline group r / P; the ranks of one stage form its
// data-parallel group, which the next strategy spreads over.
distributed::Communicator& PipelineStages::place(distributed::Communicator& ranks) {
  world_ = &ranks;
  check_pipeline(c_, world_->world_size());
  const int stage = world_->rank() % c_.pipeline, replica = world_->rank() / c_.pipeline;
  pipeline_group_ = world_->split(replica, stage);
  data_group_ = world_->split(stage, replica);
  stage_.emplace(*pipeline_group_, compute_dtype(c_.precision), c_.device);
  stage_norm_sum_ = std::make_unique<distributed::GroupSum>(*pipeline_group_);
  world_sum_ = std::make_unique<distributed::GroupSum>(*world_);
  return *data_group_;
}

std::string PipelineStages::checkpoint_subfolder() const {
  return str_cat("/stage-", stage_->stage());
}

// A stage reads its own subfolder: checkpoints of another --pipeline setting are refused here by
// name when the folders do not match, and by the run's configuration when they do.
void PipelineStages::check_resume_folder(const std::string& resume) const {
  const std::string mine = resume + checkpoint_subfolder();
  if (!std::filesystem::is_directory(mine)) {
    throw FileError(str_cat("--resume ", resume, ": no checkpoint of pipeline stage ",
                            stage_->stage(), " (", mine,
                            "): it was written with another "
                            "--pipeline setting or without one; this run has --pipeline ",
                            c_.pipeline));
  }
}

std::unique_ptr<optim::ParameterArena> PipelineStages::make_arena(nn::Module& model) {
  return std::make_unique<optim::ParameterArena>(assign_stage(model));
}

// The stages' gradient norm is one: the sum of their partial sums of squares. A tied copy gets
// the owner's update after each step.
void PipelineStages::attach(optim::Optimizer& optimizer) {
  optimizer.set_partial_sum_reducer(stage_norm_sum_.get());
  if (tied_) optimizer.set_parameter_sync(tied_.get());
}

void PipelineStages::check_plan(const optim::ResolvedBatch& batch, int64_t epoch) const {
  check_pipeline_depth(c_.pipeline, batch.accum_steps,
                       str_cat("k is ", batch.accum_steps, " in epoch ", epoch + 1));
}

void PipelineStages::describe(nlohmann::json& run_config) const {
  run_config.update({{"pipeline", c_.pipeline}, {"pipeline_stage", stage_->stage()}});
}

// The stages' layers: contiguous runs of Task::layers, cut where the running parameter count
// passes each stage's equal share (every stage keeps at least one layer). Returns this stage's
// parameters, by their names in the model; the plan is printed.
std::vector<nn::NamedTensor> PipelineStages::assign_stage(nn::Module& model) {
  if (!task_.layers || !task_.loss_of_output) {
    throw ValueError(task_.program +
                     ": --pipeline needs a model cut into layers, and this "
                     "model's task gives none (Task::layers, Task::loss_of_output)");
  }
  all_layers_ = task_.layers(model);
  const int stages = c_.pipeline, layers = static_cast<int>(all_layers_.size());
  std::vector<int64_t> sizes;
  for (const Layer& l : all_layers_) {
    int64_t n = 0;
    for (nn::Module* m : l.modules) n += m->num_parameters();
    sizes.push_back(n);
  }
  layer_stage_ = distributed::balance_stages(sizes, stages);
  std::vector<std::string> plan(stages);
  std::vector<int64_t> counts(stages, 0);
  for (int i = 0; i < layers; ++i) {
    const int s = layer_stage_[i];
    plan[s] += (plan[s].empty() ? "" : ", ") + all_layers_[i].name;
    counts[s] += sizes[i];
  }
  std::string line = str_cat("pipeline: ", stages, " stages, ",
                             distributed::schedule_name(c_.pipeline_schedule), " schedule");
  for (int s = 0; s < stages; ++s) {
    line += str_cat(" | stage ", s, ": ", plan[s], " (", counts[s], " parameters)");
  }
  log_(line);
  for (int s = 0; s < stages; ++s) {
    if (counts[s] == 0) {
      throw ValueError(str_cat("--pipeline ", stages, ": stage ", s, " (", plan[s],
                               ") would hold "
                               "no parameters; use fewer stages"));
    }
  }
  check_layers_own_each_parameter_once(model);
  std::unordered_set<const TensorImpl*> mine;
  std::unordered_map<const TensorImpl*, int> owner;  // parameter -> its layer's stage
  for (int i = 0; i < layers; ++i) {
    for (const Tensor& p : layer_parameters(all_layers_[i])) {
      owner[p.impl().get()] = layer_stage_[i];
      if (layer_stage_[i] == stage_->stage()) mine.insert(p.impl().get());
    }
    if (layer_stage_[i] == stage_->stage()) stage_layers_.push_back(all_layers_[i]);
  }
  // Borrowed parameters used on another stage than their owner's: tied across stages.
  std::vector<distributed::TiedParameters::Tie> ties;
  for (int i = 0; i < layers; ++i) {
    for (const Tensor& p : all_layers_[i].borrowed) {
      const auto it = owner.find(p.impl().get());
      if (it == owner.end()) {
        throw ValueError(str_cat(task_.program, ": layer ", all_layers_[i].name,
                                 " borrows a parameter no layer owns"));
      }
      if (it->second != layer_stage_[i]) ties.push_back({p, it->second, layer_stage_[i], master_});
    }
  }
  if (!ties.empty()) {
    log_(str_cat("pipeline: ", ties.size(),
                 " parameter(s) tied across stages: the gradient of "
                 "each copy summed into the owner's at the boundary, the update sent back"));
    tied_ = std::make_unique<distributed::TiedParameters>(*pipeline_group_, std::move(ties));
  }
  std::vector<nn::NamedTensor> own;
  for (const auto& named : model.named_parameters()) {
    parameter_stage_[named.first] = owner.at(named.second.impl().get());
    if (mine.count(named.second.impl().get())) own.push_back(named);
  }
  return own;
}

// Every parameter of the model belongs to exactly one pipeline layer: one no layer owns would
// never be trained, one owned twice would sit in two stages' arenas.
void PipelineStages::check_layers_own_each_parameter_once(nn::Module& model) const {
  std::unordered_map<const TensorImpl*, int> owners;
  for (const Layer& l : all_layers_) {
    for (const Tensor& p : layer_parameters(l)) ++owners[p.impl().get()];
  }
  for (const auto& [name, p] : model.named_parameters()) {
    const auto it = owners.find(p.impl().get());
    const int n = it == owners.end() ? 0 : it->second;
    if (n != 1) {
      throw ValueError(str_cat(task_.program, ": --pipeline: parameter ", name, " belongs to ", n,
                               " of the task's layers (Task::layers), not one"));
    }
  }
}

// With a 16-bit working copy, a stage's own parameters are 16-bit views of its arena; the other
// stages' layers it holds (for evaluation, and a tied copy it computes with) take the same dtype,
// so the whole model reads as one process's does. A tied copy's gradient stays in the master
// dtype, as an arena's does, for the exchange with its owner.
void PipelineStages::place_parameters(nn::Module& model, optim::ParameterArena& arena) {
  if (compute_ == master_) return;
  std::unordered_set<const TensorImpl*> own;
  for (const auto& entry : arena.entries()) own.insert(entry.param.impl().get());
  for (auto& [name, p] : model.named_parameters()) {
    if (own.count(p.impl().get())) continue;
    const Tensor working = to_dtype(p, compute_);
    TensorImpl& impl = *p.impl();
    impl.storage = working.impl()->storage;
    impl.offset = working.impl()->offset;
    impl.dtype = compute_;
    if (tied_ && tied_->uses(p)) impl.grad = Tensor::zeros(p.shape(), master_, p.device()).impl();
  }
}

// The master parameters of every stage, in the model's order, on every rank of the pipeline
// group (each broadcast by its stage): what --save writes and the summary hashes, as one
// process's arena would give them. Collective over the pipeline group.
std::optional<std::vector<nn::NamedTensor>> PipelineStages::whole_masters(
    optim::ParameterArena& arena, nn::Module& model) {
  std::map<std::string, Tensor> own;
  for (const auto& [name, t] : arena.named_masters()) own.emplace(name, t);
  std::vector<nn::NamedTensor> out;
  for (const auto& [name, p] : model.named_parameters()) {
    const int owner = parameter_stage_.at(name);
    Tensor t =
        owner == stage_->stage() ? own.at(name) : Tensor::empty(p.shape(), master_, p.device());
    pipeline_group_->broadcast(t, owner);
    out.emplace_back(name, t);
  }
  return out;
}

// The stages resume from the same step: each read its newest complete checkpoint, and a stage
// stopped while writing may have one fewer. The copies of tied parameters take the owner's values.
void PipelineStages::after_resume(int64_t step) {
  if (tied_) tied_->after_update();
  check_same_resume_step(*world_, step, c_.resume, "stage", true);
}

// This stage's part of a window: its micro-batches through the stage's layers under the
// schedule; the last stage computes each loss (Task::loss_of_output) and returns their sum and
// count, the other stages zeros.
nn::LossSum PipelineStages::run_micro_batches(nn::Module&, const WindowRun& run) {
  const optim::Window& w = run.window;
  const Tensor& order = run.order;
  nn::LossSum sums{Tensor::zeros({}, master_, c_.device), Tensor::zeros({}, master_, c_.device)};
  const int k = static_cast<int>(w.micro.size());
  if (k == 0) return sums;  // this data-parallel rank has no share of a short window
  std::vector<std::optional<Samples>> batches(k);
  const auto batch_of = [&](int m) -> const Samples& {
    if (!batches[m]) {
      const optim::MicroBatch& mb = w.micro[static_cast<size_t>(m)];
      batches[m] = task_.samples(order.narrow(mb.start, mb.count));
    }
    return *batches[m];
  };
  distributed::PipelineStage::Functions f;
  f.input = [&](int m) { return batch_of(m).input; };
  f.forward = [&](const Tensor& x, int m) {
    const optim::MicroBatch& mb = w.micro[static_cast<size_t>(m)];
    const nn::SampleKeys keys(c_.seed, run.step, order.narrow(mb.start, mb.count));
    Tensor h = x;
    for (const Layer& layer : stage_layers_) h = layer.forward(h);
    return h;
  };
  f.loss = [&](const Tensor& y, int m) {
    const nn::LossSum loss = task_.loss_of_output(y, batch_of(m), master_);
    Strategy::add_loss(loss, master_, sums);
    batches[m].reset();  // its activations stay on the tape; its data can go
    return loss.sum;
  };
  const distributed::StageWindowStats stats =
      stage_->run_schedule(c_.pipeline_schedule, k, run.seed, f);
  totals_.max_in_flight = std::max(totals_.max_in_flight, stats.max_in_flight);
  totals_.peak_activation_bytes =
      std::max(totals_.peak_activation_bytes, stats.peak_activation_bytes);
  totals_.busy_seconds += stats.busy_seconds;
  totals_.wait_seconds += stats.wait_seconds;
  totals_.seconds += stats.seconds;
  return sums;
}

// Every rank's model made whole: each stage broadcasts its layers' parameters and buffers over
// its pipeline group, so evaluation, saving and the summary's hash see the trained model.
void PipelineStages::gather_model(nn::Module&) {
  // Before the broadcast below makes them so: the copies kept by the steps themselves.
  if (tied_ && !tied_->copies_identical()) tied_copies_identical_ = false;
  for (size_t i = 0; i < all_layers_.size(); ++i) {
    for (Tensor t : layer_parameters(all_layers_[i]))
      pipeline_group_->broadcast(t, layer_stage_[i]);
    for (nn::Module* m : all_layers_[i].modules) {
      for (auto& [name, t] : m->named_buffers()) pipeline_group_->broadcast(t, layer_stage_[i]);
    }
  }
}

// --pipeline: every rank's stage statistics gathered; rank 0 prints its pipeline group's, one
// line per stage, and puts them in the metrics and the summary.
void PipelineStages::report(Summary& summary, MetricsLog& metrics) {
  summary.tied_copies_identical = tied_copies_identical_;
  Tensor mine =
      Tensor::from_vector<double>({6}, {double(stage_->stage()), double(totals_.max_in_flight),
                                        double(totals_.peak_activation_bytes), totals_.busy_seconds,
                                        totals_.wait_seconds, totals_.seconds});
  Tensor all = Tensor::zeros({6 * world_->world_size()}, DType::kFloat64);
  world_->all_gather(mine, all);
  const std::vector<double> v = all.to_vector<double>();
  nlohmann::json records = nlohmann::json::array();
  for (int s = 0; s < c_.pipeline; ++s) {  // world ranks 0 .. P - 1: rank 0's group
    const double* r = v.data() + 6 * s;
    StageSummary st{static_cast<int>(r[0]),
                    static_cast<int>(r[1]),
                    static_cast<size_t>(r[2]),
                    r[3],
                    r[4],
                    r[5]};
    log_(str_cat("pipeline stage ", st.stage, ": micro-batches in flight at most ",
                 st.max_in_flight, ", peak activations ", mib(st.peak_activation_bytes), ", idle ",
                 std::llround(1000 * st.idle_fraction()) / 10.0, "% of ",
                 std::llround(1000 * st.seconds) / 1000.0, " s"));
    records.push_back({{"stage", st.stage},
                       {"max_in_flight", st.max_in_flight},
                       {"peak_activation_bytes", st.peak_activation_bytes},
                       {"busy_seconds", st.busy_seconds},
                       {"wait_seconds", st.wait_seconds},
                       {"seconds", st.seconds},
                       {"idle_fraction", st.idle_fraction()}});
    summary.stages.push_back(st);
  }
  metrics.emit({{"event", "pipeline"},
                {"schedule", distributed::schedule_name(c_.pipeline_schedule)},
                {"stages", records}});
}

}  // namespace accrue::train
