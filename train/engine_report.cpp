// A run's records: each step's (its log line when skipped, metrics, callback), each epoch's
// (evaluation, log line, metrics, callback), and the summary at the end (engine_run.h).
#include "train/engine_run.h"

#include <iomanip>
#include <sstream>

#include "core/allocator.h"

namespace accrue::train::engine {

// A step's log line when skipped, its metrics record and its callback. seconds: the window's,
// whose samples (tokens) over them are the step's throughput.
void Run::report_step(const optim::StepResult& r, const EpochPlan& plan, int64_t epoch,
                      int64_t samples, int64_t tokens, double seconds) {
  if (r.skipped) {
    log(str_cat("step ", r.step, ": non-finite gradient, update skipped",
                scaling_.scaling.dynamic
                    ? str_cat(" (loss scale ", r.loss_scale, " -> ",
                              r.loss_scale * optimizer_->loss_scaling().backoff, ")")
                    : ""));
  }
  if (!r.skipped) ++(r.grad_norm == 0 ? steps_without_gradient_ : steps_with_gradient_);
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
  const double per_second = 1 / std::max(seconds, 1e-9);
  record["samples_per_second"] = static_cast<double>(samples) * per_second;
  if (task_.length) {
    record["tokens"] = tokens;
    record["tokens_per_second"] = static_cast<double>(tokens) * per_second;
  }
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
       << event.train_loss << ", " << evaluation_text(summary_.evaluation);
  nlohmann::json record = {{"event", "epoch"},
                           {"epoch", epoch + 1},
                           {"train_loss", json_number(event.train_loss)},
                           {summary_.evaluation.key, summary_.evaluation.value}};
  for (const auto& [key, value] : summary_.evaluation.details.items()) {
    line << ", " << key << " " << std::setprecision(4) << value.get<double>();
    record[key] = value;
  }
  // The best so far by the held-out measure: the epoch's own evaluation when it is one, else the
  // task's validation, taken here too when a flag follows the best.
  const int64_t step = acc_->step_clock();
  if (summary_.evaluation.held_out) {
    line << consider_for_best(summary_.evaluation, step);
  } else if (task_.validate && chooses_best()) {
    const Evaluation held_out = held_out_evaluation();
    line << ", " << evaluation_text(held_out) << consider_for_best(held_out, step);
    record[held_out.key] = held_out.value;
  }
  line << ", " << std::setprecision(2) << epoch_seconds << " s (evaluation " << eval_seconds
       << " s)";
  log(line.str());
  record["seconds"] = epoch_seconds;
  record["eval_seconds"] = eval_seconds;
  metrics_->emit(record);
  if (callbacks_.on_epoch) callbacks_.on_epoch(event);
  // This epoch's evaluation ended the run (--early-stop): the run's last measure is the final
  // one (Task::evaluate_final), as when an evaluation between steps ends it.
  if (!final && stopping_early_ && task_.evaluate_final) {
    summary_.evaluation = evaluate(true);
    log(str_cat("final evaluation: ", evaluation_text(summary_.evaluation)));
  }
}

// The summary: its fields, one line and one record.
void Run::report_summary() {
  fill_summary();
  log(summary_line());
  metrics_->emit(summary_record());
}

// The summary's fields: counters, memory, speeds, the device path, the strategies' footprint.
void Run::fill_summary() {
  summary_.steps = acc_->step_clock();
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
  // Rates over one span: this process's samples over this process's seconds.
  summary_.samples_trained = samples_trained_;
  summary_.tokens_trained = tokens_trained_;
  summary_.samples_seen = samples_seen_;
  const double seconds = summary_.train_seconds;
  summary_.samples_per_second = seconds > 0 ? static_cast<double>(samples_trained_) / seconds : 0;
  summary_.tokens_per_second = seconds > 0 ? static_cast<double>(tokens_trained_) / seconds : 0;
  if (summary_.windows_run == 0) summary_.footprint = strategies_->footprint(*arena_, *optimizer_);
  if (best_.any) {
    summary_.best = best_measure_;
    summary_.best_step = best_.step;
  }
  summary_.stopped_early = stopping_early_;
}

// "done: test accuracy 97.77% after 2345 steps | train ..."
std::string Run::summary_line() {
  const optim::MemoryStats& mem = acc_->memory();
  const optim::ResolvedBatch batch = plan_for(0).batch;
  const Evaluation& e = summary_.evaluation;
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << "done: " << evaluation_text(e) << " after "
       << summary_.steps << " steps"
       << (summary_.stopped_early
               ? str_cat(" (stopped early: ", c_.early_stop, " evaluations without improvement)")
               : "")
       << (best_.any ? ", " + best_text() : "") << " | "
       << (samples_trained_ == 0
               ? std::string("nothing trained by this process")
               : str_cat("train ", fixed_digits(summary_.train_seconds, 2), " s, ",
                         std::llround(summary_.samples_per_second), " samples/s",
                         task_.length
                             ? str_cat(", ", std::llround(summary_.tokens_per_second), " tokens/s")
                             : ""))
       << " | "
       << (k_schedule_ ? str_cat("accumulation schedule ", k_schedule_->str(), ", micro-batch ",
                                 batch.micro_batch)
                       : batch_text(batch))
       << " | device " << c_.device.str() << " | peak " << mib(mem.peak_bytes) << ", activations "
       << mib(mem.peak_activation_bytes) << ", optimizer state " << mib(optimizer_->state_bytes())
       << (world_->world_size() > 1 ? " per rank" : "") << ", model state "
       << mib(summary_.footprint.model_state()) << collectives_text()
       << strategies_->summary_part(summary_) << " | " << precision_name(c_.precision)
       << (scaling_.on ? str_cat(", loss scale ", optimizer_->scaler_state().first) : "")
       << " | skipped steps " << acc_->skipped_steps() << " | "
       << (tuner_ ? tuner_->describe()
                  : str_cat(c_.threads, c_.threads == 1 ? " thread" : " threads", " (fixed)"))
       << device_path_line();
  return line.str();
}

// The summary's metrics record, with the task's own fields.
nlohmann::json Run::summary_record() {
  const Evaluation& e = summary_.evaluation;
  const optim::MemoryStats& mem = acc_->memory();
  const optim::ResolvedBatch batch = plan_for(0).batch;
  nlohmann::json record = {{"event", "summary"},
                           {e.key, e.value},
                           {"train_seconds", summary_.train_seconds},
                           {"first_window_seconds", summary_.first_window_seconds},
                           {"samples_trained", summary_.samples_trained},
                           {"samples_seen", summary_.samples_seen},
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
                           {"precision", precision_name(c_.precision)},
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
  if (best_.any) {
    record["best"] = {{"key", best_.key}, {"value", best_.value}, {"step", best_.step}};
  }
  record["stopped_early"] = summary_.stopped_early;
  const Footprint& f = summary_.footprint;
  record["model_state_bytes"] = {{"parameters", f.parameters},
                                 {"gradients", f.gradients},
                                 {"optimizer_state", f.optimizer_state},
                                 {"total", f.model_state()}};
  record["collective_bytes"] = {{"all_reduce", f.collectives.all_reduce},
                                {"reduce_scatter", f.collectives.reduce_scatter},
                                {"all_gather", f.collectives.all_gather},
                                {"broadcast", f.collectives.broadcast},
                                {"windows", summary_.windows_run}};
  // Rates only over a span that trained something.
  if (samples_trained_ > 0) {
    record["samples_per_second"] = summary_.samples_per_second;
    record["tokens_per_second"] = summary_.tokens_per_second;
  }
  for (auto it = task_.reported.begin(); it != task_.reported.end(); ++it) {
    record[it.key()] = *it;
  }
  return record;
}

// ", collectives 1.25 MiB per window": the bytes this rank handed them, per window it ran.
std::string Run::collectives_text() const {
  const size_t total = summary_.footprint.collectives.total();
  if (total == 0 || summary_.windows_run == 0) return "";
  return str_cat(", collectives ", mib(total / static_cast<size_t>(summary_.windows_run)),
                 " per window");
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

}  // namespace accrue::train::engine
