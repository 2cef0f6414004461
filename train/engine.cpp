// The training engine (see engine.h). One Run object (engine_run.h) holds a run's state; each
// member function is one named part of the recipe, in the order train() calls them:
//   ranks and threads -> data -> model and arena -> memory budget -> window plans -> optimizer
//   and its pieces -> accumulator -> resume -> epochs (windows, evaluation) -> summary and save.
#include <algorithm>
#include <iostream>

#include "core/allocator.h"
#include "core/host_waits.h"
#include "kernels/profile.h"
#include "nn/init.h"
#include "nn/norm.h"
#include "ops/autograd.h"
#include "optim/registry.h"
#include "optim/safetensors.h"
#include "train/agreement.h"
#include "train/engine_run.h"
#include "train/sample_order.h"
#include "train/signals.h"

namespace accrue::train {

namespace engine {

namespace {

std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c, optim::ParameterArena& arena,
                                                 double lr) {
  optim::OptimizerSettings s;
  s.lr = lr;
  s.weight_decay = c.weight_decay;
  s.momentum = c.momentum;
  return optim::optimizer_kind(c.optimizer).make(arena, s);
}

}  // namespace

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
  // What splits the ranks into groups must agree first: ranks with different --pipeline would
  // wait in different communicators until the watchdog blamed a slow rank (D3).
  if (world_->world_size() > 1) {
    check_ranks_agree(*world_,
                      {{"pipeline", c_.pipeline},
                       {"pipeline_schedule", distributed::schedule_name(c_.pipeline_schedule)}});
  }
  // The strategies take their ranks: comm_ is those that share one copy of the parameters.
  strategies_ = std::make_unique<Strategies>(
      StrategyContext{c_, task_, compute_, master_, [this](const std::string& l) { log(l); }});
  comm_ = &strategies_->place(*world_);
  lead_ = world_->rank() == 0;
  summary_.prints = lead_;
  if (!lead_) c_.quiet = true;
  // One profiler trace per rank: rank r > 0 writes beside rank 0's file.
  if (!lead_ && !profile_trace_path().empty()) {
    set_profile_trace_path(str_cat(profile_trace_path(), ".rank-", world_->rank()));
  }
  writes_checkpoints_ = comm_->rank() == 0 || strategies_->checkpoints_per_rank();
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
                          [this](const std::string& line) { log(line); }, lead_});
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

namespace {

// The largest of every rank's `bytes`: the ranks' probes decide alike.
size_t largest_over_ranks(distributed::Communicator& comm, size_t bytes) {
  const std::vector<int64_t> all = gather_from_ranks(comm, static_cast<int64_t>(bytes));
  return static_cast<size_t>(*std::max_element(all.begin(), all.end()));
}

}  // namespace

// --memory-budget: the optimizer's state is allocated first, in the strategies' layout (it is part
// of the baseline), then
// probe micro-steps of the first b samples pick the micro-batch; everything after sees it in c_.
// A probe's gradients are zeroed and the model's buffers restored, so training starts as
// without it.
void Run::fit_memory_budget() {
  if (!c_.memory_budget) return;
  const int64_t batch_size = c_.batch > 0 ? c_.batch : kDefaultBatch;
  optimizer_ = make_optimizer(c_, *arena_, run_lr(c_, batch_size));
  // The strategies' layout is the baseline: ZeRO's slice of the state, not the whole.
  strategies_->attach(*optimizer_);
  check_batch_splits(batch_size, comm_->world_size());
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
    if (Strategy* runner = strategies_->window_runner()) {
      // The strategy's own micro-step (ZeRO-3: the layers gathered one at a time).
      const optim::Window w{0, b, {{0, b}}, 1};
      const Tensor seed = Tensor::from_vector<double>(
          {}, {1.0 / static_cast<double>(std::max<int64_t>(items, 1))}, c_.device);
      strategies_->begin_window(w);
      runner->run_micro_batches(*model_, WindowRun{w, index, to_dtype(seed, master_), 0, true});
    } else {
      const nn::SampleKeys keys(0, 0, index);
      const Samples batch =
          task_.largest_samples ? task_.largest_samples(index) : task_.samples(index);
      const nn::LossSum loss = task_.loss(*model_, batch, master_);
      backward(loss.sum, 1.0 / static_cast<double>(std::max<int64_t>(items, 1)));
    }
    size_t peak = alloc.stats().peak_bytes - before;
    arena_->zero_grad();
    if (comm_->world_size() > 1) peak = largest_over_ranks(*comm_, peak);  // one decision
    size_t i = 0;
    for (auto& [name, t] : model_->named_buffers()) t.copy_(buffers[i++]);
    return peak;
  };
  const int64_t budget = *c_.memory_budget;
  // A strategy's own layout from the start (ZeRO-3 releases the layers it gathered to build).
  if (strategies_->window_runner()) strategies_->begin_window(optim::Window{0, 0, {}, 0});
  size_t baseline = allocator_for(c_.device).stats().live_bytes;
  if (comm_->world_size() > 1) baseline = largest_over_ranks(*comm_, baseline);
  budget_ = fit_micro_batch(budget, batch_size / comm_->world_size(), baseline, probe);
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
    EpochPlan plan{b,
                   optim::plan_windows(train_samples_, b, optim::LastWindow::kFlush, comm_->rank()),
                   run_lr(c_, b.batch)};
    it = plans_.emplace(b.accum_steps, std::move(plan)).first;
  }
  return it->second;
}

// The optimizer and the strategies' pieces around it (their seams: a sharded state, a partial-sum
// reducer, a parameter sync), then the loss scale, which those pieces may have to pass on.
void Run::build_optimizer() {
  k_schedule_ = c_.accum_schedule;
  if (!optimizer_) {  // else fit_memory_budget() built and attached it
    optimizer_ = make_optimizer(c_, *arena_, plan_for(0).lr);
    strategies_->attach(*optimizer_);
  }
  if (scaling_.on) optimizer_->set_loss_scaling(scaling_.scaling, scaling_.initial);
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
  options.schedule = {c_.schedule, c_.warmup, total_steps_, 0.0};
  options.gradients = strategies_->gradients();
  options.loss_reducer = strategies_->loss_reducer();
  const int64_t bucket_kib = c_.bucket_kib.value_or(strategies_->default_bucket_kib());
  options.bucket_bytes = static_cast<size_t>(bucket_kib) * 1024;
  options.graph_boundary = graphs_ != nullptr;
  acc_ = std::make_unique<optim::Accumulator>(*optimizer_, options);
}

// Buffers (BatchNorm's running statistics) are rank 0's on every rank, as with PyTorch's DDP:
// each rank updates its own from its own samples, training-mode BatchNorm never reads them, and
// after every boundary rank 0's overwrite the rest -- so evaluation, saving and checkpoints see
// the same buffers on every rank, and no collective runs inside a window.
void Run::broadcast_buffers() {
  if (comm_->world_size() == 1) return;
  for (auto& [name, t] : model_->named_buffers()) comm_->broadcast(t, 0);
}

// The batch arithmetic in words; under --pipeline its ranks are data-parallel groups of stages,
// which the job's process count (the metrics' "ranks") is not: both are said.
std::string Run::batch_text(const optim::ResolvedBatch& batch) const {
  if (c_.pipeline == 1) return batch.str();
  return str_cat(batch.str(), " (", world_->world_size(), " processes: ", comm_->world_size(),
                 " data-parallel x ", c_.pipeline, " pipeline stages)");
}

// One of the task's measures of the whole model, in eval mode without gradients.
Evaluation Run::measure(const std::function<Evaluation(nn::Module&)>& measure) {
  if (!measure) return Evaluation{};
  strategies_->gather_model(*model_);
  NoGradGuard no_grad;
  model_->eval();  // BatchNorm: running statistics; Dropout: off
  struct BackToTraining {
    nn::Module& m;
    ~BackToTraining() { m.train(); }
  } back{*model_};
  return measure(*model_);
}

Evaluation Run::evaluate(bool final) {
  return measure(final && task_.evaluate_final ? task_.evaluate_final : task_.evaluate);
}

// Runs the epoch's windows from the run's position. A requested stop ends it after the window in
// progress (the epoch's end is reported only if that was its last window).
void Run::run_epoch(int64_t epoch) {
  const EpochPlan& plan = plan_for(epoch);
  if (k_schedule_ &&
      (epoch == 0 || plan.batch.accum_steps != plan_for(epoch - 1).batch.accum_steps)) {
    log(str_cat("epoch ", epoch + 1, ": ", batch_text(plan.batch), ", lr ", plan.lr));
  }
  acc_->set_base_lr(plan.lr);
  progress_->set_steps_per_epoch(static_cast<int64_t>(plan.windows.size()));
  std::vector<int32_t> order_host = epoch_order(train_samples_, c_.seed, epoch, c_.shuffle);
  order_shares_by_length(plan, order_host);
  const Tensor order = Tensor::from_vector<int32_t>({train_samples_}, order_host, c_.device);
  const auto epoch_start = Clock::now();
  // The epoch's training time leaves out what runs between its windows: evaluations (--eval-every)
  // and checkpoints (--checkpoint-every).
  double between_windows = 0;
  const auto training_seconds = [&] { return seconds_since(epoch_start) - between_windows; };
  const bool resumed = epoch == start_.epoch;  // mid-epoch: the checkpoint's sums continue
  const size_t first = resumed ? static_cast<size_t>(start_.window) : 0;
  int64_t step_in_epoch = static_cast<int64_t>(first);
  int64_t epoch_items = resumed ? start_.epoch_items : 0;
  double epoch_loss = resumed ? start_.epoch_loss : 0;
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
    const double window_seconds = seconds_since(window_start);
    if (tuner_) tuner_->record(window_seconds / static_cast<double>(w.samples));
    if (samples_trained_ == 0) summary_.first_window_seconds = window_seconds;
    samples_seen_ += w.samples;
    samples_trained_ += w.samples;
    const int64_t tokens = tokens_of(w, order_host);
    tokens_trained_ += tokens;
    epoch_items += r.items;
    epoch_loss += r.loss * static_cast<double>(r.items);
    ++step_in_epoch;
    report_step(r, plan, epoch, w.samples, tokens, window_seconds);
    const double elapsed = summary_.train_seconds + training_seconds();
    progress_->update(epoch, step_in_epoch, r.step, r.loss, r.grad_norm, r.lr,
                      static_cast<double>(samples_trained_) / std::max(elapsed, 1e-9));
    const bool last = wi + 1 == plan.windows.size();
    const int64_t step = acc_->step_clock(), skipped = acc_->skipped_steps();
    position_ = last ? TrainPosition{step, skipped, epoch + 1, 0}
                     : TrainPosition{step,       skipped,    epoch, static_cast<int64_t>(wi + 1),
                                     epoch_loss, epoch_items};
    if (c_.eval_every > 0 && r.step % c_.eval_every == 0) {
      const auto eval_start = Clock::now();
      evaluate_between_steps(epoch, r.step);
      between_windows += seconds_since(eval_start);
    }
    // The epoch's end (its evaluation may choose the best) before the checkpoint that holds it.
    // A stop requested mid-epoch reports no epoch.
    const bool run_ends = acc_->step_clock() >= total_steps_ || stopping_early_;
    if (last || (run_ends && !r.stop)) {
      end_epoch(epoch, epoch_loss, epoch_items, training_seconds(),
                !r.stop && (epoch + 1 >= c_.epochs || run_ends));
    }
    if (c_.checkpoint_every > 0 && acc_->step_clock() % c_.checkpoint_every == 0) {
      const auto checkpoint_start = Clock::now();
      write_checkpoint(position_);
      between_windows += seconds_since(checkpoint_start);
    }
    if (r.stop) stop(r);
    if (run_ends) break;
  }
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
  refuse_a_run_without_gradient();
  const std::vector<nn::NamedTensor> masters = strategies_->whole_masters(*arena_, *model_);
  summary_.parameter_hash = tensor_hash(masters);
  summary_.buffer_hash = tensor_hash(model_->named_buffers());
  summary_.buckets_overlapped = acc_->buckets_overlapped();
  summary_.buckets_at_step = acc_->buckets_at_step();
  if (!c_.save.empty()) save_weights(c_.save, masters);
}

// A run none of whose steps had a gradient (each skipped or of norm 0) trained nothing: exit 1,
// as a run whose every step was skipped, naming the loss scale when one multiplied the loss.
void Run::refuse_a_run_without_gradient() const {
  if (steps_without_gradient_ == 0 || steps_with_gradient_ > 0) return;
  const double scale = optimizer_->scaler_state().first;
  throw std::runtime_error(
      str_cat("no update was applied: all ", steps_without_gradient_,
              " steps this run took had a gradient norm of 0",
              scale != 1 ? str_cat(" (loss scale ", scale,
                                   ": the scaled gradients underflow to zero; raise --loss-scale)")
                         : " (the loss does not depend on the weights)",
              c_.save.empty() ? "" : "; nothing saved"));
}

// --save, --save-init and --keep-best (rank 0): the weights and buffers, with the task's
// metadata and `extra`.
void Run::write_weights(const std::string& path, const std::vector<nn::NamedTensor>& masters,
                        const std::map<std::string, std::string>& extra) {
  if (!lead_) return;
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  if (task_.metadata) {
    for (auto& [key, value] : task_.metadata()) metadata[key] = value;
  }
  for (const auto& [key, value] : extra) metadata[key] = value;
  const std::vector<nn::NamedTensor> tensors = with_buffers(masters, *model_);
  optim::save_safetensors(path, tensors, optim::with_digest(metadata, tensors));
}

void Run::save_weights(const std::string& path, const std::vector<nn::NamedTensor>& masters) {
  write_weights(path, masters);
  if (lead_) log("saved weights to " + path);
}

Summary Run::train() {
  const RunSignals signals;  // stop requests recorded; SIGXFSZ and SIGPIPE ignored
  setup_ranks_and_threads();
  check_best_can_be_chosen();
  // Before the checkpoint folder (and its stage folders) is created: a resume of another layout
  // leaves nothing behind.
  if (!c_.resume.empty()) strategies_->check_resume_folder(c_.resume);
  if (writes_checkpoints_ && !checkpoint_dir_.empty()) {
    check_checkpoint_folder(checkpoint_dir_, resume_dir_);  // the command line checked c_'s
    checkpoint_lock_.emplace(checkpoint_dir_);
  }
  run_id_ = new_run_id();
  if (!c_.resume.empty()) check_recorded_settings(c_.resume, task_.settings);
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
    const std::vector<nn::NamedTensor> masters = strategies_->whole_masters(*arena_, *model_);
    save_weights(c_.save_init, masters);
    wait_for_the_lead(bytes_of(masters));
  }
  metrics_ = std::make_unique<MetricsLog>(lead_ ? c_.metrics : std::string());
  // A new file starts with the run's id, so that a resume never continues another run's file.
  if (c_.resume.empty() || !metrics_->continue_from(start_.step, start_.epoch, run_id_)) {
    metrics_->emit({{"event", "run"}, {"run_id", run_id_}, {"program", task_.program}});
  }
  const EpochPlan& first = plan_for(0);
  log(task_.program + ": " + batch_text(first.batch) + ", lr " + std::to_string(first.lr) + " (" +
      optim::lr_scaling_name(c_.lr_scaling) + " scaling)" +
      (k_schedule_ ? ", accumulation schedule " + k_schedule_->str() : "") + ", " +
      std::to_string(model_->num_parameters()) + " parameters, device " + c_.device.str() + ", " +
      std::to_string(train_samples_) + " training samples");
  // The training state's bytes, now that the optimizer exists.
  summary_.device_state_bytes = allocator_for(c_.device).stats().live_bytes - device_bytes_before_;
  summary_.host_state_bytes = pinned_host_allocator().stats().live_bytes - host_bytes_before_;
  progress_ = std::make_unique<Progress>(
      out_, std::cerr, c_.quiet, is_terminal_run(out_, world_->world_size()),
      Progress::Span{static_cast<int64_t>(first.windows.size()), acc_->step_clock(), total_steps_});
  position_ = start_;
  if (start_.epoch >= c_.epochs || acc_->step_clock() >= total_steps_ || stopping_early_) {
    // A finished run resumed: its model is evaluated, nothing is trained.
    log(stopping_early_
            ? str_cat("nothing left to train: --early-stop ", c_.early_stop, " ended the run at ",
                      "step ", start_.step, " (", best_.evaluations_since,
                      " evaluations since the best, at step ", best_.step, ")")
            : str_cat("nothing left to train: the checkpoint is at step ", start_.step, " of ",
                      total_steps_, " (", c_.epochs, " epochs",
                      c_.max_steps > 0 ? ", --max-steps" : "", ")"));
    summary_.evaluation = evaluate(true);
  }
  for (int64_t epoch = start_.epoch;
       epoch < c_.epochs && acc_->step_clock() < total_steps_ && !stopping_early_; ++epoch) {
    run_epoch(epoch);
  }
  finish();
  return summary_;
}

}  // namespace engine

Summary train(const Config& config, Task& task, std::ostream& out, const Callbacks& callbacks) {
  if (config.profile) enable_profile();
  engine::Run run(config, task, out, callbacks);
  return run.train();
}

}  // namespace accrue::train
