// The training engine (see engine.h). One Run object holds a run's state; each member function is
// one named part of the recipe, in the order train() calls them:
//   ranks and threads -> data -> model and arena -> memory budget -> window plans -> optimizer
//   and its pieces -> accumulator -> resume -> epochs (windows, evaluation) -> summary and save.
#include "train/engine.h"

#include <exception>
#include <filesystem>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/allocator.h"
#include "core/host_waits.h"
#include "core/staging.h"
#include "core/threads.h"
#include "kernels/factories.h"
#include "kernels/profile.h"
#include "nn/init.h"
#include "nn/norm.h"
#include "ops/autograd.h"
#include "optim/accumulator.h"
#include "optim/registry.h"
#include "optim/safetensors.h"
#include "optim/schedule.h"
#include "train/agreement.h"
#include "train/budget.h"
#include "train/checkpoint.h"
#include "train/report.h"
#include "train/sample_order.h"
#include "train/signals.h"
#include "train/step_graphs.h"
#include "train/strategies.h"

namespace accrue::train {

namespace {

// Micro-step graphs held at most: G2P's shapes (micro-batch rows x sequence length) number a few
// dozen; past this a new shape runs eagerly.
constexpr int64_t kMaxStepGraphs = 64;

std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c, optim::ParameterArena& arena,
                                                 double lr) {
  optim::OptimizerSettings s;
  s.lr = lr;
  if (c.weight_decay >= 0) s.weight_decay = c.weight_decay;
  s.momentum = c.momentum;
  return optim::optimizer_kind(c.optimizer).make(arena, s);
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
  void log(const std::string& line) const {
    if (!c_.quiet) out_ << line << "\n";
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
  void validate_position(const Checkpoint& saved);
  void save_weights(const std::string& path, const std::vector<nn::NamedTensor>& masters);
  void write_checkpoint(const TrainPosition& position);
  void broadcast_buffers();
  void run_epoch(int64_t epoch);
  [[noreturn]] void stop(const optim::StepResult& last);
  void report_step(const optim::StepResult& r, const EpochPlan& plan, int64_t epoch,
                   int64_t samples, int64_t tokens);
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
                       const std::vector<int32_t>& order_host,
                       const std::function<int64_t(int64_t, int64_t)>& items_of);
  void setup_device_path();
  Evaluation evaluate(bool final);
  void finish();
  void report_summary();
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
  LossScaleChoice scaling_;
  int64_t train_samples_ = 0;
  size_t device_bytes_before_ = 0, host_bytes_before_ = 0;
  std::unique_ptr<nn::Module> model_;
  std::unique_ptr<optim::ParameterArena> arena_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::optional<BudgetDecision> budget_;
  std::optional<optim::AccumSchedule> k_schedule_;
  std::map<int64_t, EpochPlan> plans_;  // by k
  std::unique_ptr<optim::Accumulator> acc_;
  // The device path: host-built micro-batches staged one ahead (Task::host_batch), and the
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
  int64_t samples_seen_ = 0;
  int64_t tokens_trained_ = 0;  // by this process's run (not before a resume), every rank
};

// Data parallel: every rank trains; rank 0 alone prints, writes metrics and saves. Each rank
// takes the GPU of its local rank when the device is CUDA.
void Run::setup_ranks_and_threads() {
  const distributed::LaunchInfo launch = distributed::launch_info();
  if (c_.device.is_cuda() && c_.comm == nullptr && launch.world_size > 1) {
    // One GPU per rank. Under srun --gpus-per-task each rank sees one GPU: its cuda:0.
    const int visible = cuda_device_count();
    if (visible > 1 && launch.local_rank >= visible) {
      throw DeviceError(str_cat("rank ", launch.rank, " has local rank ", launch.local_rank,
                                " but this node shows ", visible, " GPUs: one GPU per rank"));
    }
    c_.device = Device::cuda(visible == 1 ? 0 : launch.local_rank);
  }
  compute_ = compute_dtype(c_.precision);
  master_ = master_dtype(c_.precision);
  world_ = c_.comm != nullptr ? c_.comm : &distributed::world_for(c_.device);
  world_->set_timeout(c_.comm_timeout);
  // The strategies take their ranks: comm_ is those that share one copy of the parameters.
  strategies_ = std::make_unique<Strategies>(
      StrategyContext{c_, task_, compute_, master_, [this](const std::string& l) { log(l); }});
  comm_ = &strategies_->place(*world_);
  lead_ = world_->rank() == 0;
  if (!lead_) c_.quiet = true;
  writes_checkpoints_ = comm_->rank() == 0;
  const std::string subfolder = strategies_->checkpoint_subfolder();
  checkpoint_dir_ = c_.checkpoint.empty() ? "" : c_.checkpoint + subfolder;
  resume_dir_ = c_.resume.empty() ? "" : c_.resume + subfolder;
  // --threads N fixes the team; 0 lets the tuner pick among 1, 2, 4, ..., every core by timing
  // windows as they run (core/threads.h). Either way the weights are the same to the bit.
  if (c_.threads > 0) {
    set_cpu_threads(c_.threads);
  } else {
    tuner_.emplace(ThreadTuner::default_candidates(cpu_cores()));
  }
  scaling_ = resolve_loss_scale(c_.loss_scale, c_.precision);
}

void Run::build_model() {
  train_samples_ =
      task_.prepare(Setup{c_.device, compute_, master_, comm_->rank(), comm_->world_size(), comm_,
                          [this](const std::string& line) { log(line); }});
  if (c_.train_limit > 0) train_samples_ = std::min(train_samples_, c_.train_limit);
  if (train_samples_ <= 0) throw ValueError("[train] the task's training set is empty");
  // What the model, its arena and its optimizer hold is measured from here.
  device_bytes_before_ = allocator_for(c_.device).stats().live_bytes;
  host_bytes_before_ = pinned_host_allocator().stats().live_bytes;
  nn::manual_seed(c_.seed);
  model_ = task_.model(master_);
  if (!c_.init.empty()) optim::load_parameters(*model_, c_.init);
  model_->to(c_.device);
  // The arena of the parameters this rank updates (a stage's own, padded to ZeRO's shards), its
  // 16-bit working copy, then where the strategies keep masters and other parameters.
  arena_ = strategies_->make_arena(*model_);
  if (compute_ != master_) arena_->use_working_copy(compute_);
  strategies_->place_parameters(*model_, *arena_);
}

// Before any other collective: every rank must train the same model on the same data with the
// same recipe (agreement.h). Left out: what may differ per rank (threads, outputs, quiet, which
// GPU).
void Run::check_ranks_agree_before_training() {
  if (world_->world_size() == 1) return;
  nlohmann::ordered_json settings = {{"program", task_.program},
                                     {"device_type", c_.device.is_cuda() ? "cuda" : "cpu"},
                                     {"micro_batch", c_.micro_batch},
                                     {"accum_steps", c_.accum_steps},
                                     {"batch", c_.batch},
                                     {"memory_budget", c_.memory_budget},
                                     {"epochs", c_.epochs},
                                     {"max_steps", c_.max_steps},
                                     {"train_limit", c_.train_limit},
                                     {"pipeline", c_.pipeline},
                                     {"pipeline_schedule", c_.pipeline_schedule}};
  settings.update(recipe());
  settings.update(nlohmann::ordered_json{{"bucket_kib", c_.bucket_kib},
                                         {"offload_optimizer", c_.offload_optimizer},
                                         {"checkpoint", !c_.checkpoint.empty()},
                                         {"checkpoint_every", c_.checkpoint_every},
                                         {"resume", !c_.resume.empty()},
                                         {"init", !c_.init.empty()}});
  for (auto it = task_.settings.begin(); it != task_.settings.end(); ++it) {
    settings["task." + it.key()] = *it;
  }
  // Last, what follows from the above: a different flag is named rather than its consequence.
  settings["train_samples"] = train_samples_;
  nlohmann::json layout = nlohmann::json::array();
  const auto add = [&](const std::vector<nn::NamedTensor>& tensors) {
    for (const auto& [name, t] : tensors) {
      layout.push_back(str_cat(name, " ", dtype_name(t.dtype()), shape_str(t.shape())));
    }
  };
  add(model_->named_parameters());
  add(model_->named_buffers());
  settings["parameter_layout"] = layout;
  settings["initial_parameters"] = tensor_hash(model_->named_parameters());
  check_ranks_agree(*world_, settings);
}

// --memory-budget: the optimizer's state is allocated first (it is part of the baseline), then
// probe micro-steps of the first b samples pick the micro-batch; everything after sees it in c_.
// A probe's gradients are zeroed and the model's buffers restored, so training starts as
// without it.
void Run::fit_memory_budget() {
  if (c_.memory_budget.empty()) return;
  const int64_t batch_size = c_.batch > 0 ? c_.batch : 128;
  optimizer_ = make_optimizer(
      c_, *arena_,
      optim::scale_lr(c_.lr, batch_size, c_.base_batch, optim::parse_lr_scaling(c_.lr_scaling)));
  if (batch_size % comm_->world_size() != 0) {
    throw ValueError(
        str_cat("--batch ", batch_size, " does not split over ", comm_->world_size(), " ranks"));
  }
  const auto probe = [&](int64_t b) -> size_t {
    b = std::min<int64_t>(b, train_samples_);
    std::vector<Tensor> buffers;
    for (const auto& [name, t] : model_->named_buffers()) buffers.push_back(t.clone());
    std::vector<int32_t> first(static_cast<size_t>(b));
    int64_t items = 0;
    for (int64_t i = 0; i < b; ++i) {
      first[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      items += task_.items ? task_.items(i) : 1;
    }
    const Tensor index = Tensor::from_vector<int32_t>({b}, first, c_.device);
    CachingAllocator& alloc = allocator_for(c_.device);
    const size_t before = alloc.stats().live_bytes;
    alloc.reset_peak();
    {
      const nn::SampleKeys keys(0, 0, index);
      const Batch batch = task_.largest_batch ? task_.largest_batch(index) : task_.batch(index);
      const nn::LossSum loss = task_.loss(*model_, batch, master_);
      backward(loss.sum, 1.0 / static_cast<double>(std::max<int64_t>(items, 1)));
    }
    const size_t peak = alloc.stats().peak_bytes - before;
    arena_->zero_grad();
    size_t i = 0;
    for (auto& [name, t] : model_->named_buffers()) t.copy_(buffers[i++]);
    return peak;
  };
  const int64_t budget = parse_bytes(c_.memory_budget);
  budget_ = fit_micro_batch(budget, batch_size / comm_->world_size(),
                            allocator_for(c_.device).stats().live_bytes, probe);
  c_.batch = batch_size;
  c_.micro_batch = budget_->micro_batch;
  c_.accum_steps = 0;
  log(budget_->str(budget, batch_size));
}

// The batch plan of an epoch (0-based): one for the whole run, or, with --accum-schedule, one
// per k.
const EpochPlan& Run::plan_for(int64_t epoch) {
  Config ce = c_;
  if (k_schedule_) {
    ce.accum_steps = k_schedule_->k_at(epoch + 1);
    ce.batch = 0;
  }
  const optim::ResolvedBatch b = resolve_config_batch(ce, comm_->world_size());
  strategies_->check_plan(b, epoch);
  auto it = plans_.find(b.accum_steps);
  if (it == plans_.end()) {
    const optim::LrScaling rule = optim::parse_lr_scaling(c_.lr_scaling);
    EpochPlan plan{b,
                   optim::plan_windows(train_samples_, b, optim::LastWindow::kFlush, comm_->rank()),
                   optim::scale_lr(c_.lr, b.batch, c_.base_batch, rule)};
    it = plans_.emplace(b.accum_steps, std::move(plan)).first;
  }
  return it->second;
}

// The optimizer and the strategies' pieces around it (their seams: a sharded state, a partial-sum
// reducer, a parameter sync), then the loss scale, which those pieces may have to pass on.
void Run::build_optimizer() {
  if (!c_.accum_schedule.empty()) {
    k_schedule_ = optim::AccumSchedule::parse(c_.accum_schedule, INT32_MAX);
  }
  if (!optimizer_) optimizer_ = make_optimizer(c_, *arena_, plan_for(0).lr);
  strategies_->attach(*optimizer_);
  if (scaling_.on) {
    optim::LossScaling ls;
    ls.dynamic = scaling_.dynamic;
    optimizer_->set_loss_scaling(ls, scaling_.initial);
  }
}

void Run::build_accumulator() {
  total_steps_ = 0;
  for (int64_t e = 0; e < c_.epochs && total_steps_ < INT64_MAX; ++e) {
    const int64_t n = static_cast<int64_t>(plan_for(e).windows.size());
    if (__builtin_add_overflow(total_steps_, n, &total_steps_)) total_steps_ = INT64_MAX;
    if (!k_schedule_ && __builtin_mul_overflow(n, c_.epochs, &total_steps_)) {
      total_steps_ = INT64_MAX;
    }
    if (!k_schedule_) break;  // every epoch alike
  }
  if (c_.max_steps > 0) total_steps_ = std::min(total_steps_, c_.max_steps);
  optim::AccumulatorOptions options;
  options.max_norm = c_.clip;
  options.base_lr = plan_for(0).lr;
  options.schedule = {optim::Schedule::parse(c_.schedule), c_.warmup, total_steps_, 0.0};
  options.gradients = strategies_->gradients();
  options.loss_reducer = strategies_->loss_reducer();
  const int64_t bucket_kib = c_.bucket_kib >= 0 ? c_.bucket_kib : strategies_->default_bucket_kib();
  options.bucket_bytes = static_cast<size_t>(bucket_kib) * 1024;
  options.graph_boundary = graphs_ != nullptr;
  acc_ = std::make_unique<optim::Accumulator>(*optimizer_, options);
}

// Host-built micro-batches are staged (Task::host_batch); micro-steps and the boundary are
// replayed from CUDA graphs on a GPU unless --cuda-graphs off (pipeline stages run eagerly).
void Run::setup_device_path() {
  if (task_.host_batch) stager_ = std::make_unique<HostToDevice>(c_.device);
  if (c_.device.is_cuda() && c_.cuda_graphs != CudaGraphs::kOff &&
      strategies_->window_runner() == nullptr) {
    graphs_ = std::make_unique<StepGraphs>(c_.device, kMaxStepGraphs,
                                           [this](const std::string& line) { log(line); });
  }
}

// The recipe's settings as given: precision, optimizer, learning rate and schedule, clipping,
// the k schedule, sharding and the seed.
nlohmann::ordered_json Run::recipe() const {
  return {{"precision", c_.precision},
          {"loss_scale", c_.loss_scale},
          {"optimizer", c_.optimizer},
          {"weight_decay", c_.weight_decay},
          {"momentum", c_.momentum},
          {"lr", c_.lr},
          {"lr_scaling", c_.lr_scaling},
          {"base_batch", c_.base_batch},
          {"schedule", c_.schedule},
          {"warmup", c_.warmup},
          {"clip", c_.clip},
          {"accum_schedule", c_.accum_schedule},
          {"zero", c_.zero},
          {"seed", c_.seed},
          {"shuffle", c_.shuffle}};
}

// What a resume must match to continue this run bit for bit: the recipe, the resolved batch,
// the ranks, the data's size and the task's settings.
nlohmann::json Run::run_config() {
  const optim::ResolvedBatch batch = plan_for(0).batch;
  nlohmann::json j = recipe();
  j.update({{"batch", batch.batch},
            {"micro_batch", batch.micro_batch},
            {"accum_steps", k_schedule_ ? 0 : batch.accum_steps},
            {"ranks", comm_->world_size()},
            {"train_samples", train_samples_}});
  for (auto it = task_.settings.begin(); it != task_.settings.end(); ++it) j[it.key()] = *it;
  strategies_->describe(j);
  return j;
}

// --resume: the masters and buffers, then the working copy from the masters (what it always
// is), the optimizer's state and the step clock.
void Run::resume() {
  if (c_.resume.empty()) return;
  strategies_->check_resume_folder(c_.resume);
  auto state = arena_->named_masters();
  for (auto& b : model_->named_buffers()) state.push_back(b);
  // A checkpoint with a model tensor this model lacks is at fault itself: the older one is tried.
  const auto only_known_tensors = [&](const Checkpoint& c) {
    for (const auto& [name, t] : c.model) {
      const bool known = std::any_of(state.begin(), state.end(),
                                     [&](const nn::NamedTensor& s) { return s.first == name; });
      if (!known) {
        throw FileError(str_cat(c.path, ": the checkpoint has '", name, "' (", t.describe(),
                                "), which the model does not"));
      }
    }
  };
  const Checkpoint saved = read_latest_checkpoint(resume_dir_, [&](const Checkpoint& c) {
    validate_position(c);
    only_known_tensors(c);
  });
  check_compatible(saved.config, run_config_, saved.path);
  if (!saved.run_id.empty()) run_id_ = saved.run_id;
  for (auto& [name, t] : state) {
    // The dtype as saved, or a narrower integer one (an int32 BatchNorm counter, widened).
    const auto it = saved.model.find(name);
    if (it == saved.model.end() || it->second.shape() != t.shape() ||
        (it->second.dtype() != t.dtype() && !integer_widens(it->second.dtype(), t.dtype()))) {
      throw FileError(str_cat(saved.path, ": the checkpoint's '", name, "' is ",
                              it == saved.model.end() ? "missing" : it->second.describe(),
                              ", the model's is ", t.describe()));
    }
    t.copy_(to_dtype(it->second, t.dtype()).to(t.device()));
  }
  if (arena_->working().defined()) {
    arena_->working().copy_(to_dtype(arena_->params(), arena_->working().dtype()));
  }
  try {
    optimizer_->load_state(saved.optimizer);
  } catch (const std::invalid_argument& e) {
    throw FileError(str_cat(saved.path, ": its optimizer state does not fit this run: ", e.what()));
  }
  acc_->restore_clock(saved.position.step, saved.position.skipped);
  strategies_->after_resume(saved.position.step);
  start_ = saved.position;
  last_checkpoint_ = start_.step;  // already on disk
  // The samples seen before the position: whole epochs, then the windows of its epoch.
  samples_seen_ = start_.epoch * train_samples_;
  const auto& windows = plan_for(start_.epoch).windows;
  for (int64_t w = 0; w < start_.window; ++w)
    samples_seen_ += windows[static_cast<size_t>(w)].samples;
  log(str_cat("resumed from ", saved.path, ": step ", start_.step, ", epoch ", start_.epoch + 1,
              ", window ", start_.window + 1));
}

// A checkpoint's position must be one this run's plan reaches: the windows of the epochs before
// it plus its window are its step, and the window exists in its epoch. An edited step, epoch or
// window would otherwise silently move the run to other samples or another schedule point.
void Run::validate_position(const Checkpoint& saved) {
  const TrainPosition& p = saved.position;
  constexpr int64_t kMaxEpochs = 1000000;  // the --epochs flag's limit
  if (p.epoch > kMaxEpochs) {
    throw FileError(str_cat(saved.path, ": epoch ", p.epoch, " is beyond any run (", kMaxEpochs,
                            " epochs at most)"));
  }
  int64_t steps = 0;
  for (int64_t e = 0; e < p.epoch && steps <= p.step; ++e) {
    steps += static_cast<int64_t>(plan_for(e).windows.size());
  }
  const int64_t windows = static_cast<int64_t>(plan_for(p.epoch).windows.size());
  if (p.window >= windows || steps + p.window != p.step) {
    throw FileError(str_cat(saved.path, ": position step ", p.step, ", epoch ", p.epoch,
                            ", window ", p.window, " is not one this run reaches (epoch ", p.epoch,
                            " starts at step ", steps, " and has ", windows, " windows)"));
  }
}

// What --save and a checkpoint's model part hold: the master parameters, then the buffers.
std::vector<nn::NamedTensor> saved_state(optim::ParameterArena& arena, const nn::Module& model) {
  std::vector<nn::NamedTensor> state = arena.named_masters();
  for (auto& b : model.named_buffers()) state.push_back(b);
  return state;
}

// A checkpoint of the state after position.step windows (every rank takes part: a sharded
// optimizer gathers its state; rank 0 writes).
void Run::write_checkpoint(const TrainPosition& position) {
  if (c_.checkpoint.empty() || position.step == last_checkpoint_) return;
  const auto optimizer_state = optimizer_->save_state();
  const auto model_state = saved_state(*arena_, *model_);
  // The metrics first: killed between the two, the resume starts from the previous checkpoint
  // and drops the records past it; the other way round, records would be lost.
  if (lead_) metrics_->publish();
  if (writes_checkpoints_) {
    train::write_checkpoint(checkpoint_dir_, run_id_, run_config_, position, model_state,
                            optimizer_state);
  }
  if (world_->world_size() > 1) {
    // No rank reads it before it is complete. The others wait here while rank 0 writes: the
    // watchdog allows that at a slow disk's 1 MiB/s.
    size_t bytes = 0;
    for (const auto& state : {&optimizer_state, &model_state}) {
      for (const auto& [name, t] : *state) bytes += t.nbytes();
    }
    const distributed::LongWaitAllowance allowance(*world_, static_cast<double>(bytes) / (1 << 20));
    world_->barrier();
  }
  last_checkpoint_ = position.step;
  if (callbacks_.on_checkpoint) callbacks_.on_checkpoint({position.step, c_.checkpoint});
}

// With Task::length, each window's share of this rank (its micro-batches are one contiguous
// range of the order) is sorted by length, stably: every rank computes the same order, the
// window's sum is the same, and a micro-batch pads only to its own longest sequence.
void Run::order_shares_by_length(const EpochPlan& plan, std::vector<int32_t>& order) const {
  if (!task_.length) return;
  for (const optim::Window& w : plan.windows) {
    if (w.micro.empty()) continue;
    const auto begin = order.begin() + w.micro.front().start;
    const auto end = order.begin() + w.micro.back().start + w.micro.back().count;
    std::vector<std::pair<int64_t, int32_t>> keyed;
    for (auto it = begin; it != end; ++it) keyed.emplace_back(task_.length(*it), *it);
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < keyed.size(); ++i) begin[static_cast<int64_t>(i)] = keyed[i].second;
  }
}

// The window's non-padding tokens over every rank (Task::length), 0 without.
int64_t Run::tokens_of(const optim::Window& w, const std::vector<int32_t>& order) const {
  if (!task_.length) return 0;
  int64_t n = 0;
  for (int64_t i = w.start; i < w.start + w.samples; ++i) n += task_.length(order[i]);
  return n;
}

// One window: each micro-batch's samples, their loss and its count, through the accumulator.
// The window's items (its normaliser) come from the plan: the dataset's per-sample counts over
// every rank's share, summed without a collective. A CUDA graph that cannot be captured (a
// dropout, a call that waits for the device) turns graphs off, under --cuda-graphs auto, and
// the window runs again eagerly from its start (the failed capture abandoned it).
optim::StepResult Run::run_window(const optim::Window& w, const Tensor& order,
                                  const std::vector<int32_t>& order_host) {
  try {
    return run_window_once(w, order, order_host);
  } catch (const GraphCaptureError& e) {
    if (c_.cuda_graphs == CudaGraphs::kOn) throw;
    log(str_cat("CUDA graphs off for the rest of the run: ", e.what()));
    if (graphs_) graph_counts_ = graphs_->counts();
    graphs_.reset();
    acc_->set_graph_boundary(false);
    return run_window_once(w, order, order_host);
  }
}

optim::StepResult Run::run_window_once(const optim::Window& w, const Tensor& order,
                                       const std::vector<int32_t>& order_host) {
  const auto items_of = [&](int64_t start, int64_t count) {
    if (!task_.items) return count;
    int64_t n = 0;
    for (int64_t i = start; i < start + count; ++i) n += task_.items(order_host[i]);
    return n;
  };
  acc_->begin_window(items_of(w.start, w.samples), [&] {
    int64_t n = 0;
    for (const optim::MicroBatch& mb : w.micro) n += items_of(mb.start, mb.count);
    return n;
  }());
  if (Strategy* runner = strategies_->window_runner()) {
    acc_->pipelined_window([&](const Tensor& seed) {
      return runner->run_window(*model_, WindowRun{w, order, seed, acc_->steps()});
    });
  } else {
    run_micro_steps(w, order, order_host, items_of);
  }
  if (stop_requested() != 0) acc_->request_stop();
  const optim::StepResult r = acc_->step();
  // The step read the device, after every copy staged for this window.
  if (stager_) stager_->release_waited();
  broadcast_buffers();
  return r;
}

// The window's micro-steps. A micro-step's inputs are its samples' positions in the training
// set (Task::batch gathers them on the device), or its samples assembled on the host
// (Task::host_batch), staged one micro-batch ahead so the copy of the next runs while this one
// computes; either way through the micro-step graphs when there are.
void Run::run_micro_steps(const optim::Window& w, const Tensor& order,
                          const std::vector<int32_t>& order_host,
                          const std::function<int64_t(int64_t, int64_t)>& items_of) {
  struct Staged {
    HostToDevice::Pending input, target;
  };
  const auto stage = [&](const optim::MicroBatch& mb) {
    const std::vector<int32_t> rows(order_host.begin() + mb.start,
                                    order_host.begin() + mb.start + mb.count);
    const Batch host = task_.host_batch(Tensor::from_vector<int32_t>({mb.count}, rows));
    return Staged{stager_->stage(host.input), stager_->stage(host.target)};
  };
  // An exception leaves copies staged and never waited for: the stream waits for them before
  // their blocks go to other work (a window run again after a failed graph capture).
  struct DiscardOnUnwind {
    HostToDevice* stager;
    ~DiscardOnUnwind() {
      if (stager == nullptr || std::uncaught_exceptions() == 0) return;
      try {
        stager->discard_pending();
      } catch (...) {  // the exception in flight says what went wrong
      }
    }
  } discard{stager_.get()};
  std::optional<Staged> next;
  if (stager_ && !w.micro.empty()) next = stage(w.micro.front());
  for (size_t m = 0; m < w.micro.size(); ++m) {
    const optim::MicroBatch& mb = w.micro[m];
    const Tensor index = order.narrow(mb.start, mb.count);
    std::vector<Tensor> inputs{index};
    if (stager_) {
      Staged current = std::move(*next);
      if (m + 1 < w.micro.size()) next = stage(w.micro[m + 1]);
      inputs = {stager_->ready(current.input), stager_->ready(current.target)};
    }
    const auto loss = [&](const std::vector<Tensor>& in) {
      // Dropout's masks are keyed by the samples and the optimizer step, not the split.
      const nn::SampleKeys keys(c_.seed, acc_->steps(), index);
      const Batch batch = stager_ ? Batch{in[0], in[1]} : task_.batch(in[0]);
      return task_.loss(*model_, batch, master_);
    };
    const int64_t items = items_of(mb.start, mb.count);
    if (graphs_) {
      graphs_->micro_step(*acc_, items, inputs, loss);
    } else {
      acc_->micro_step(items, [&] { return loss(inputs); });
    }
  }
}

// Buffers (BatchNorm's running statistics) are rank 0's on every rank, as with PyTorch's DDP:
// each rank updates its own from its own samples, training-mode BatchNorm never reads them, and
// after every boundary rank 0's overwrite the rest -- so evaluation, saving and checkpoints see
// the same buffers on every rank, and no collective runs inside a window.
void Run::broadcast_buffers() {
  if (comm_->world_size() == 1) return;
  for (auto& [name, t] : model_->named_buffers()) comm_->broadcast(t, 0);
}

Evaluation Run::evaluate(bool final) {
  strategies_->gather_model(*model_);
  NoGradGuard no_grad;
  model_->eval();  // BatchNorm: running statistics; Dropout: off
  struct BackToTraining {
    nn::Module& m;
    ~BackToTraining() { m.train(); }
  } back{*model_};
  if (final && task_.evaluate_final) return task_.evaluate_final(*model_);
  return task_.evaluate ? task_.evaluate(*model_) : Evaluation{};
}

// A step's log line when skipped, its metrics record and its callback.
void Run::report_step(const optim::StepResult& r, const EpochPlan& plan, int64_t epoch,
                      int64_t samples, int64_t tokens) {
  if (r.skipped) {
    log(str_cat("step ", r.step, ": non-finite gradient, update skipped",
                scaling_.dynamic ? str_cat(" (loss scale ", r.loss_scale, " -> ",
                                           r.loss_scale * optim::LossScaling{}.backoff, ")")
                                 : ""));
  }
  const StepEvent event{r.step,
                        epoch + 1,
                        samples,
                        r.items,
                        tokens,
                        r.loss,
                        r.grad_norm,
                        r.lr,
                        r.skipped,
                        r.loss_scale,
                        plan.batch.accum_steps,
                        plan.batch.batch};
  nlohmann::json record = {{"step", r.step},
                           {"epoch", epoch + 1},
                           {"samples", samples_seen_},
                           {"loss", json_number(r.loss)},
                           {"grad_norm", json_number(r.grad_norm)},
                           {"lr", r.lr},
                           {"skipped", r.skipped},
                           {"loss_scale", r.loss_scale},
                           {"accum_steps", plan.batch.accum_steps},
                           {"batch", plan.batch.batch},
                           {"threads", cpu_threads()}};
  if (task_.length) record["tokens"] = tokens;
  metrics_->emit(record);
  if (callbacks_.on_step) callbacks_.on_step(event);
}

// The end of an epoch: its time, the evaluation, its log line, metrics record and callback.
void Run::end_epoch(int64_t epoch, double epoch_loss, int64_t epoch_items, double epoch_seconds,
                    bool final) {
  summary_.train_seconds += epoch_seconds;
  progress_->end_epoch();
  const auto eval_start = Clock::now();
  summary_.evaluation = evaluate(final);
  const double eval_seconds = seconds_since(eval_start);
  const EpochEvent event{epoch + 1,
                         epoch_loss / static_cast<double>(std::max<int64_t>(epoch_items, 1)),
                         summary_.evaluation, epoch_seconds};
  std::ostringstream line;
  line << "epoch " << epoch + 1 << ": train loss " << std::fixed << std::setprecision(4)
       << event.train_loss << ", " << summary_.evaluation.label << " " << std::setprecision(2)
       << (summary_.evaluation.percent ? 100 * summary_.evaluation.value
                                       : summary_.evaluation.value)
       << (summary_.evaluation.percent ? "%" : "");
  nlohmann::json record = {{"event", "epoch"},
                           {"epoch", epoch + 1},
                           {"train_loss", json_number(event.train_loss)},
                           {summary_.evaluation.key, summary_.evaluation.value}};
  for (const auto& [key, value] : summary_.evaluation.details.items()) {
    line << ", " << key << " " << std::setprecision(4) << value.get<double>();
    record[key] = value;
  }
  line << ", " << std::setprecision(2) << epoch_seconds << " s (evaluation " << eval_seconds
       << " s)";
  log(line.str());
  record["seconds"] = epoch_seconds;
  record["eval_seconds"] = eval_seconds;
  metrics_->emit(record);
  if (callbacks_.on_epoch) callbacks_.on_epoch(event);
}

// Runs the epoch's windows from the run's position. A requested stop ends it after the window in
// progress (the epoch's end is reported only if that was its last window).
void Run::run_epoch(int64_t epoch) {
  const EpochPlan& plan = plan_for(epoch);
  if (k_schedule_ &&
      (epoch == 0 || plan.batch.accum_steps != plan_for(epoch - 1).batch.accum_steps)) {
    log(str_cat("epoch ", epoch + 1, ": ", plan.batch.str(), ", lr ", plan.lr));
  }
  acc_->set_base_lr(plan.lr);
  progress_->set_steps_per_epoch(static_cast<int64_t>(plan.windows.size()));
  std::vector<int32_t> order_host = epoch_order(train_samples_, c_.seed, epoch, c_.shuffle);
  order_shares_by_length(plan, order_host);
  const Tensor order = Tensor::from_vector<int32_t>({train_samples_}, order_host, c_.device);
  const auto epoch_start = Clock::now();
  int64_t step_in_epoch = 0, epoch_items = 0;
  double epoch_loss = 0;
  const size_t first = epoch == start_.epoch ? static_cast<size_t>(start_.window) : 0;
  for (size_t wi = first; wi < plan.windows.size(); ++wi) {
    const optim::Window& w = plan.windows[wi];
    if (tuner_) set_cpu_threads(tuner_->next());
    const auto window_start = Clock::now();
    const HostWaits waits_before = host_waits();
    const optim::StepResult r = run_window(w, order, order_host);
    if (r.step > start_.step + 1) {
      summary_.window_waits = summary_.window_waits + (host_waits() - waits_before);
      ++summary_.windows_measured;
    }
    if (tuner_) tuner_->record(seconds_since(window_start) / static_cast<double>(w.samples));
    samples_seen_ += w.samples;
    const int64_t tokens = tokens_of(w, order_host);
    tokens_trained_ += tokens;
    epoch_items += r.items;
    epoch_loss += r.loss * static_cast<double>(r.items);
    ++step_in_epoch;
    report_step(r, plan, epoch, w.samples, tokens);
    const double elapsed = summary_.train_seconds + seconds_since(epoch_start);
    progress_->update(epoch, step_in_epoch, r.step, r.loss, r.grad_norm, r.lr,
                      static_cast<double>(samples_seen_) / std::max(elapsed, 1e-9));
    const bool last = wi + 1 == plan.windows.size();
    position_ = {acc_->steps(), acc_->skipped_steps(), last ? epoch + 1 : epoch,
                 last ? 0 : static_cast<int64_t>(wi + 1)};
    if (c_.checkpoint_every > 0 && acc_->steps() % c_.checkpoint_every == 0) {
      write_checkpoint(position_);
    }
    if (r.stop) {
      if (last) end_epoch(epoch, epoch_loss, epoch_items, seconds_since(epoch_start), false);
      stop(r);
    }
    if (acc_->steps() >= total_steps_) break;
  }
  end_epoch(epoch, epoch_loss, epoch_items, seconds_since(epoch_start),
            epoch + 1 >= c_.epochs || acc_->steps() >= total_steps_);
}

// A requested stop, after the window it interrupted: the checkpoint of this step, the metrics,
// then Stopped (run.h: exit status 75 on every rank).
void Run::stop(const optim::StepResult& last) {
  write_checkpoint(position_);
  metrics_->commit();
  const int signal = stop_requested();
  const std::string why =
      signal != 0 ? "stopped by " + signal_name(signal) : "stopped at another rank's request";
  throw Stopped(str_cat(why, " after step ", last.step,
                        c_.checkpoint.empty()
                            ? "; no --checkpoint was given, so nothing can be resumed"
                            : "; continue with --resume " + c_.checkpoint,
                        c_.metrics.empty() ? "" : " (metrics written to " + c_.metrics + ")"));
}

// The summary: counters, memory, the offloaded optimizer's traffic, one line and one record.
void Run::report_summary() {
  summary_.steps = acc_->steps();
  summary_.skipped_steps = acc_->skipped_steps();
  summary_.graphs = graphs_ ? graphs_->counts() : graph_counts_;
  summary_.graphs.boundaries_replayed = acc_->boundaries_replayed();
  summary_.device_reserved_bytes = allocator_for(c_.device).stats().reserved_bytes;
  summary_.device_used_bytes = device_memory(c_.device).used;
  summary_.final_loss_scale = optimizer_->scaler_state().first;
  const optim::MemoryStats& mem = acc_->memory();
  summary_.peak_activation_bytes = mem.peak_activation_bytes;
  summary_.peak_bytes = mem.peak_bytes;
  const optim::ResolvedBatch batch = plan_for(0).batch;
  summary_.micro_batch = batch.micro_batch;
  if (budget_) {
    summary_.activation_bytes_per_sample = budget_->per_sample;
    summary_.activation_fixed_bytes = budget_->fixed;
    summary_.memory_baseline_bytes = budget_->baseline;
  }
  summary_.samples_per_second =
      static_cast<double>(samples_seen_) / std::max(summary_.train_seconds, 1e-9);
  summary_.tokens_per_second =
      static_cast<double>(tokens_trained_) / std::max(summary_.train_seconds, 1e-9);
  summary_.footprint = strategies_->footprint(*arena_, *optimizer_);
  const Evaluation& e = summary_.evaluation;
  std::ostringstream line;
  line << "done: " << e.label << " " << std::fixed << std::setprecision(2)
       << (e.percent ? 100 * e.value : e.value) << (e.percent ? "%" : "") << " after "
       << summary_.steps << " steps | train " << summary_.train_seconds << " s, "
       << std::setprecision(0) << summary_.samples_per_second << " samples/s"
       << (task_.length ? str_cat(", ", std::llround(summary_.tokens_per_second), " tokens/s") : "")
       << " | "
       << (k_schedule_ ? str_cat("accumulation schedule ", k_schedule_->str(), ", micro-batch ",
                                 batch.micro_batch)
                       : batch.str())
       << " | device " << c_.device.str() << " | peak " << mib(mem.peak_bytes) << ", activations "
       << mib(mem.peak_activation_bytes) << ", optimizer state " << mib(optimizer_->state_bytes())
       << (world_->world_size() > 1 ? " per rank" : "") << strategies_->summary_part(summary_)
       << " | " << c_.precision
       << (scaling_.on ? str_cat(", loss scale ", optimizer_->scaler_state().first) : "")
       << " | skipped steps " << acc_->skipped_steps() << " | "
       << (tuner_ ? tuner_->describe() : std::to_string(c_.threads) + " threads (fixed)")
       << device_path_line();
  log(line.str());
  nlohmann::json record = {{"event", "summary"},
                           {e.key, e.value},
                           {"train_seconds", summary_.train_seconds},
                           {"samples_per_second", summary_.samples_per_second},
                           {"tokens_per_second", summary_.tokens_per_second},
                           {"steps", summary_.steps},
                           {"skipped_steps", acc_->skipped_steps()},
                           {"peak_bytes", mem.peak_bytes},
                           {"peak_activation_bytes", mem.peak_activation_bytes},
                           {"optimizer_state_bytes", optimizer_->state_bytes()},
                           {"device_state_bytes", summary_.device_state_bytes},
                           {"host_state_bytes", summary_.host_state_bytes},
                           {"offload_optimizer", c_.offload_optimizer},
                           {"offload_to_host_bytes", summary_.offload.to_host_bytes},
                           {"offload_from_host_bytes", summary_.offload.from_host_bytes},
                           {"ranks", world_->world_size()},
                           {"zero", c_.zero},
                           {"batch", batch.batch},
                           {"micro_batch", batch.micro_batch},
                           {"accum_steps", batch.accum_steps},
                           {"device", c_.device.str()},
                           {"precision", c_.precision},
                           {"loss_scale", summary_.final_loss_scale},
                           {"threads", cpu_threads()},
                           {"thread_switches", tuner_ ? tuner_->switches() : 0},
                           {"windows_measured", summary_.windows_measured},
                           {"window_host_reads", summary_.window_waits.reads},
                           {"window_device_waits", summary_.window_waits.device_waits()},
                           {"window_blocking_copies", summary_.window_waits.blocking_copies},
                           {"window_synchronizations", summary_.window_waits.synchronizations},
                           {"window_polls", summary_.window_waits.polls},
                           {"window_system_memory", summary_.window_waits.system_memory},
                           {"graphs", summary_.graphs.graphs},
                           {"graph_replays", summary_.graphs.replayed},
                           {"graph_captures", summary_.graphs.captured},
                           {"eager_micro_steps", summary_.graphs.eager},
                           {"boundary_replays", summary_.graphs.boundaries_replayed},
                           {"device_reserved_bytes", summary_.device_reserved_bytes},
                           {"device_used_bytes", summary_.device_used_bytes}};
  for (auto it = task_.reported.begin(); it != task_.reported.end(); ++it) {
    record[it.key()] = *it;
  }
  metrics_->emit(record);
}

// The summary's words on the device path: how often a window waited for the device, the CUDA
// graphs, and the device's memory as its driver sees it.
std::string Run::device_path_line() const {
  const int64_t n = std::max<int64_t>(summary_.windows_measured, 1);
  const HostWaits& w = summary_.window_waits;
  std::ostringstream line;
  line << std::fixed << std::setprecision(2)
       << " | a window waits: " << static_cast<double>(w.reads) / static_cast<double>(n)
       << " reads, " << static_cast<double>(w.device_waits()) / static_cast<double>(n)
       << " device waits";
  if (!c_.device.is_cuda()) return line.str();
  const GraphCounts& g = summary_.graphs;
  line << " | CUDA graphs: " << g.graphs << " held, " << g.replayed << " micro-steps replayed, "
       << g.eager << " eager, " << g.boundaries_replayed << " boundaries replayed | device "
       << mib(summary_.device_reserved_bytes) << " reserved, " << mib(summary_.device_used_bytes)
       << " in use";
  return line.str();
}

// The end of the run: its last checkpoint, the summary, the metrics file, and --save.
void Run::finish() {
  write_checkpoint(position_);  // unless that step was just written
  strategies_->gather_model(*model_);
  strategies_->report(summary_, *metrics_);
  report_summary();
  metrics_->commit();
  if (summary_.steps > 0 && summary_.skipped_steps == summary_.steps) {
    throw std::runtime_error(str_cat("no update was applied: all ", summary_.steps,
                                     " steps were skipped (non-finite gradients)",
                                     c_.save.empty() ? "" : "; nothing saved"));
  }
  const std::vector<nn::NamedTensor> masters = strategies_->whole_masters(*arena_, *model_);
  summary_.parameter_hash = tensor_hash(masters);
  summary_.buffer_hash = tensor_hash(model_->named_buffers());
  summary_.buckets_overlapped = acc_->buckets_overlapped();
  summary_.buckets_at_step = acc_->buckets_at_step();
  if (!c_.save.empty()) save_weights(c_.save, masters);
}

// --save and --save-init (rank 0): the weights and buffers, with the task's metadata.
void Run::save_weights(const std::string& path, const std::vector<nn::NamedTensor>& masters) {
  if (!lead_) return;
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  if (task_.metadata) {
    for (auto& [key, value] : task_.metadata()) metadata[key] = value;
  }
  std::vector<nn::NamedTensor> state = masters;
  for (auto& b : model_->named_buffers()) state.push_back(b);
  optim::save_safetensors(path, state, metadata);
  log("saved weights to " + path);
}

Summary Run::train() {
  const RunSignals signals;  // stop requests recorded; SIGXFSZ and SIGPIPE ignored
  setup_ranks_and_threads();
  if (writes_checkpoints_ && !checkpoint_dir_.empty()) {
    check_checkpoint_folder(checkpoint_dir_, resume_dir_);  // the command line checked c_'s
    checkpoint_lock_.emplace(checkpoint_dir_);
  }
  run_id_ = new_run_id();
  build_model();
  check_ranks_agree_before_training();
  fit_memory_budget();
  build_optimizer();
  setup_device_path();
  build_accumulator();
  run_config_ = run_config();
  resume();
  if (!c_.save_init.empty()) {
    strategies_->gather_model(*model_);  // the buffers of a resumed pipeline's other stages
    save_weights(c_.save_init, strategies_->whole_masters(*arena_, *model_));
  }
  metrics_ = std::make_unique<MetricsLog>(lead_ ? c_.metrics : std::string());
  if (!c_.resume.empty()) metrics_->continue_from(start_.step, start_.epoch);
  const EpochPlan& first = plan_for(0);
  log(task_.program + ": " + first.batch.str() + ", lr " + std::to_string(first.lr) + " (" +
      c_.lr_scaling + " scaling)" +
      (k_schedule_ ? ", accumulation schedule " + k_schedule_->str() : "") + ", " +
      std::to_string(model_->num_parameters()) + " parameters, device " + c_.device.str() + ", " +
      std::to_string(train_samples_) + " training samples");
  // The training state's bytes, now that the optimizer exists.
  summary_.device_state_bytes = allocator_for(c_.device).stats().live_bytes - device_bytes_before_;
  summary_.host_state_bytes = pinned_host_allocator().stats().live_bytes - host_bytes_before_;
  progress_ =
      std::make_unique<Progress>(out_, c_.quiet, static_cast<int64_t>(first.windows.size()));
  position_ = start_;
  if (start_.epoch >= c_.epochs || acc_->steps() >= total_steps_) {
    // A finished run resumed: its model is evaluated, nothing is trained.
    log(str_cat("nothing left to train: the checkpoint is at step ", start_.step, " of ",
                total_steps_, " (", c_.epochs, " epochs", c_.max_steps > 0 ? ", --max-steps" : "",
                ")"));
    summary_.evaluation = evaluate(true);
  }
  for (int64_t epoch = start_.epoch; epoch < c_.epochs && acc_->steps() < total_steps_; ++epoch) {
    run_epoch(epoch);
  }
  finish();
  return summary_;
}

}  // namespace

Summary train(const Config& config, Task& task, std::ostream& out, const Callbacks& callbacks) {
  if (config.profile) enable_profile();
  Run run(config, task, out, callbacks);
  return run.train();
}

}  // namespace accrue::train
