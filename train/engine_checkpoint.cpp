// The run's recipe and configuration (what ranks must agree on and a resume must match),
// the resume, and the checkpoints (engine_run.h).
#include "train/engine_run.h"

#include <algorithm>
#include <filesystem>

#include "core/file.h"
#include "distributed/zero.h"
#include "kernels/factories.h"
#include "optim/safetensors.h"
#include "optim/strict_json.h"
#include "train/agreement.h"
#include "train/sample_order.h"

namespace accrue::train::engine {

namespace fs = std::filesystem;

// The recipe's settings as given: precision, optimizer, learning rate and schedule, clipping,
// the k schedule, sharding and the seed.
nlohmann::ordered_json Run::recipe() const {
  // The values as checkpoints have always held them (an unset weight decay is -1, no k schedule
  // ""), so that older checkpoints resume.
  return {{"precision", precision_name(c_.precision)},
          {"loss_scale", c_.loss_scale.str()},
          {"optimizer", c_.optimizer},
          {"weight_decay", c_.weight_decay.value_or(-1.0)},
          {"momentum", c_.momentum},
          {"lr", c_.lr},
          {"lr_scaling", optim::lr_scaling_name(c_.lr_scaling)},
          {"base_batch", c_.base_batch},
          {"schedule", optim::schedule_name(c_.schedule)},
          {"warmup", c_.warmup},
          {"clip", c_.clip},
          {"accum_schedule", c_.accum_schedule ? c_.accum_schedule->str() : std::string()},
          {"zero", c_.zero},
          {"seed", c_.seed},
          {"shuffle", c_.shuffle}};
}

// What a resume must match to continue this run bit for bit: the recipe, the resolved batch,
// the ranks, the device's type, the data (its size, and its files' hash when it writes or reads
// checkpoints), a cosine schedule's horizon and the task's settings.
nlohmann::json Run::run_config() {
  const optim::ResolvedBatch batch = plan_for(0).batch;
  nlohmann::json j = recipe();
  j.update({{"batch", batch.batch},
            {"micro_batch", batch.micro_batch},
            {"accum_steps", k_schedule_ ? 0 : batch.accum_steps},
            {"ranks", comm_->world_size()},
            {"device_type", c_.device.is_cuda() ? "cuda" : "cpu"},
            {"train_samples", train_samples_}});
  if (!task_.data_files.empty() && (!c_.checkpoint.empty() || !c_.resume.empty())) {
    j["data_hash"] = files_hash(task_.data_files);
  }
  // The step at which the decay reaches 0, set by the run's length.
  if (c_.schedule == optim::ScheduleKind::kCosine) j["horizon"] = total_steps_;
  for (auto it = task_.settings.begin(); it != task_.settings.end(); ++it) j[it.key()] = *it;
  strategies_->describe(j);
  return j;
}

// Before any other collective: every rank must train the same model on the same data with the
// same recipe (agreement.h). Left out: what may differ per rank (threads, outputs, quiet, which
// GPU).
void Run::check_ranks_agree_before_training() {
  if (world_->world_size() == 1) return;
  nlohmann::ordered_json settings = {
      {"program", task_.program},
      {"device_type", c_.device.is_cuda() ? "cuda" : "cpu"},
      {"micro_batch", c_.micro_batch},
      {"accum_steps", c_.accum_steps},
      {"batch", c_.batch},
      {"memory_budget", c_.memory_budget.value_or(0)},
      {"epochs", c_.epochs},
      {"max_steps", c_.max_steps},
      {"train_limit", c_.train_limit},
      {"pipeline", c_.pipeline},
      {"pipeline_schedule", distributed::schedule_name(c_.pipeline_schedule)}};
  settings.update(recipe());
  // These change which collectives run when (an evaluation gathers a sharded model).
  const char* zero_reduce = c_.zero_reduce ? distributed::zero_reduce_name(*c_.zero_reduce) : "";
  const char* zero_prefetch =
      c_.zero_prefetch ? distributed::zero_prefetch_name(*c_.zero_prefetch) : "";
  settings.update(nlohmann::ordered_json{{"bucket_kib", c_.bucket_kib.value_or(-1)},
                                         {"zero_reduce", zero_reduce},
                                         {"zero_prefetch", zero_prefetch},
                                         {"eval_every", c_.eval_every},
                                         {"keep_best", c_.keep_best},
                                         {"early_stop", c_.early_stop},
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

// --resume: the masters and buffers, then the working copy from the masters (what it always
// is), the optimizer's state and the step clock.
void Run::resume() {
  if (c_.resume.empty()) return;
  // Masters offloaded in slices (ZeRO-1 and 2): read whole, each rank keeping its slice.
  Tensor whole;
  if (!arena_->masters_whole()) whole = Tensor::zeros({arena_->size()}, arena_->dtype());
  auto state =
      with_buffers(whole.defined() ? arena_->named_views(whole) : arena_->named_masters(), *model_);
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
  // Another configuration first: its position would read as damage under this run's plan.
  const Checkpoint saved = read_latest_checkpoint(resume_dir_, [&](const Checkpoint& c) {
    check_same_horizon(c);
    check_compatible(c.config, run_config_, c.path);
    validate_position(c);
    only_known_tensors(c);
    try {
      optimizer_->check_state(c.optimizer);  // what load_state() below checks, refused here
    } catch (const std::invalid_argument& e) {
      throw FileError(str_cat(c.path, ": its optimizer state does not fit this run: ", e.what()));
    }
  });
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
  if (whole.defined()) {
    arena_->masters().copy_(whole.narrow(arena_->masters_begin(), arena_->masters().numel()));
  }
  if (arena_->working().defined()) {
    const Tensor& masters = whole.defined() ? whole : arena_->masters();
    arena_->working().copy_(to_dtype(masters, arena_->working().dtype()));
  }
  optimizer_->load_state(saved.optimizer);
  acc_->restore_clock(saved.position.step, saved.position.skipped);
  strategies_->after_resume(saved.position.step);
  // Where every rank read the folder rank 0 wrote, they must have read the same step (the
  // strategies that checkpoint per rank compared theirs above).
  if (!strategies_->checkpoints_per_rank()) {
    check_same_resume_step(*world_, saved.position.step, c_.resume, "rank", false);
  }
  start_ = saved.position;
  // The position is on disk already when this run checkpoints into the folder it resumed from;
  // a resume into another folder writes it there too, even with nothing left to train.
  std::error_code same_error;
  if (!c_.checkpoint.empty() && fs::equivalent(c_.checkpoint, c_.resume, same_error)) {
    last_checkpoint_ = start_.step;
  }
  best_ = saved.best;
  // A run --early-stop ended stays ended: its checkpoint holds the evaluations since the best.
  stopping_early_ = c_.early_stop > 0 && best_.evaluations_since >= c_.early_stop;
  best_measure_.key = best_measure_.label = best_.key;
  best_measure_.percent = false;
  best_measure_.value = best_.value;
  carry_best_weights();
  // The samples seen before the position: whole epochs, then the windows of its epoch.
  samples_seen_ = start_.epoch * train_samples_;
  const auto& windows = plan_for(start_.epoch).windows;
  for (int64_t w = 0; w < start_.window; ++w)
    samples_seen_ += windows[static_cast<size_t>(w)].samples;
  log(str_cat("resumed from ", saved.path, ": step ", start_.step, ", epoch ", start_.epoch + 1,
              ", window ", start_.window + 1));
}

// --keep-best: the best so far comes along with the resume. The weights in the folder it resumed
// from are the checkpoint's best only if they say so: a run stopped after a better evaluation
// but before its next checkpoint left newer ones (this run evaluates that step again), and a
// damaged file is no best. Resumed into another --checkpoint folder, the file is copied there, so
// the folder the summary names holds it even when the resumed run never improves on it.
void Run::carry_best_weights() {
  best_weights_kept_ = false;
  if (!c_.keep_best || !best_.any || !lead_) return;
  const fs::path from = fs::path(c_.resume) / kBestWeights;
  std::error_code ec;
  // The header alone (the weights may be large): its step, and where this rank holds the whole
  // model, the model's tensors.
  std::string problem;
  try {
    if (!fs::exists(from, ec)) throw FileError(from.string() + " is missing");
    std::map<std::string, std::string> meta;
    const auto tensors = optim::read_safetensors_header(from.string(), &meta);
    const auto step = meta.find("accrue.best.step");
    if (step == meta.end() || step->second != std::to_string(best_.step)) {
      problem = str_cat("it holds the weights of step ",
                        step == meta.end() ? "(none given)" : step->second,
                        ", not those of the checkpoint's best (step ", best_.step, ")");
    } else if (c_.pipeline == 1 && c_.zero != 3) {
      const auto state = model_->named_state();
      const bool same = tensors.size() == state.size() &&
                        std::all_of(state.begin(), state.end(), [&](const nn::NamedTensor& t) {
                          const auto it = tensors.find(t.first);
                          return it != tensors.end() && it->second.shape == t.second.shape();
                        });
      if (!same) problem = "its tensors are not the model's";
    }
  } catch (const std::exception& e) {
    problem = e.what();
  }
  if (!problem.empty()) {
    log(str_cat("--keep-best: ", problem.rfind(from.string(), 0) == 0 ? "" : from.string() + ": ",
                problem, "; the best weights are written again when this run's evaluations ",
                "choose them"));
    return;
  }
  best_weights_kept_ = true;
  if (c_.checkpoint.empty() || fs::equivalent(c_.resume, c_.checkpoint, ec)) return;
  fs::create_directories(c_.checkpoint, ec);
  AtomicFile out(best_weights_path());
  const std::vector<uint8_t> bytes = read_file_bytes(from.string());
  out.write(bytes.data(), bytes.size());
  out.commit();
}

// A cosine schedule decays to 0 at the run's last step: a resumed run of another length would
// follow another curve from the checkpoint on.
void Run::check_same_horizon(const Checkpoint& saved) const {
  const auto saved_horizon = saved.config.find("horizon");
  const auto horizon = run_config_.find("horizon");
  if (saved_horizon == saved.config.end() || horizon == run_config_.end() ||
      *saved_horizon == *horizon) {
    return;
  }
  throw ValueError(str_cat(
      "--resume: ", saved.path, ": its cosine schedule decays to 0 at step ",
      optim::brief_json(*saved_horizon), ", this run's at step ", optim::brief_json(*horizon),
      " (--epochs, --max-steps): a cosine run keeps the length it began with"));
}

// A checkpoint's position must be one this run's plan reaches: the windows of the epochs before
// it plus its window are its step, and the window exists in its epoch. An edited step, epoch or
// window would otherwise silently move the run to other samples or another schedule point.
void Run::validate_position(const Checkpoint& saved) {
  const TrainPosition& p = saved.position;
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
  // The epoch's items so far are those of the windows before the position, in the epoch's order:
  // an edited count would report another epoch loss, or overflow.
  if (!p.has_epoch_sums || p.window == 0) return;
  std::vector<int32_t> order = epoch_order(train_samples_, c_.seed, p.epoch, c_.shuffle);
  order_shares_by_length(plan_for(p.epoch), order);
  const int64_t end = plan_for(p.epoch).windows[static_cast<size_t>(p.window)].start;
  const int64_t items = items_in(order, 0, end);
  if (p.epoch_items != items) {
    throw FileError(str_cat(saved.path, ": position epoch_items is ", p.epoch_items, ", but the ",
                            p.window, " windows of epoch ", p.epoch, " before it hold ", items,
                            " items"));
  }
}

// A checkpoint of the state after position.step windows (every rank takes part: a sharded
// optimizer gathers its state; rank 0 writes).
void Run::write_checkpoint(const TrainPosition& position) {
  if (c_.checkpoint.empty() || position.step == last_checkpoint_) return;
  const auto optimizer_state = optimizer_->save_state();
  const auto model_state =
      with_buffers(arena_->masters_whole() ? arena_->named_masters()
                                           : strategies_->whole_masters(*arena_, *model_),
                   *model_);
  // The metrics first: killed between the two, the resume starts from the previous checkpoint
  // and drops the records past it; the other way round, records would be lost.
  if (lead_) metrics_->publish();
  if (writes_checkpoints_) {
    train::write_checkpoint(checkpoint_dir_, run_id_, run_config_, nlohmann::json(c_.run_flags),
                            position, best_, model_state, optimizer_state);
  }
  // No rank reads it before it is complete.
  wait_for_the_lead(bytes_of(optimizer_state) + bytes_of(model_state));
  last_checkpoint_ = position.step;
  if (callbacks_.on_checkpoint) callbacks_.on_checkpoint({position.step, c_.checkpoint});
}

// Rank 0 wrote a file of `bytes` alone: the others wait for it here, allowed a slow disk's
// 1 MiB/s, rather than in their next collective, whose watchdog would take the write for a hung
// rank.
void Run::wait_for_the_lead(size_t bytes) {
  if (world_->world_size() == 1) return;
  const distributed::LongWaitAllowance allowance(*world_, static_cast<double>(bytes) / (1 << 20));
  world_->barrier();
}

}  // namespace accrue::train::engine
