// The training loop of accrue-mnist (see trainer.h).
#include "trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>

#include "accrue.h"
#include "budget.h"
#include "core/file.h"
#include "dataset.h"
#include "resume.h"

namespace accrue::mnist {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string mib(size_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return s.str();
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c, optim::ParameterArena& arena,
                                                 double lr) {
  if (c.optimizer == "sgd") {
    optim::SgdOptions o;
    o.lr = lr;
    o.momentum = c.momentum;
    o.weight_decay = c.weight_decay < 0 ? 0.0 : c.weight_decay;
    return std::make_unique<optim::SGD>(arena, o);
  }
  optim::AdamOptions o = c.optimizer == "adamw" ? optim::AdamW::defaults() : optim::AdamOptions{};
  o.lr = lr;
  if (c.weight_decay >= 0) o.weight_decay = c.weight_decay;
  if (c.optimizer == "adamw") return std::make_unique<optim::AdamW>(arena, o);
  return std::make_unique<optim::Adam>(arena, o);
}

// A JSON number, or for NaN and infinities the strings "nan", "inf", "-inf" (JSON has no
// non-finite numbers, and null would hide which one it was).
nlohmann::json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

// Appends one JSON Lines record to the metrics file, when there is one.
void emit(const std::unique_ptr<AtomicFile>& metrics, const nlohmann::json& record) {
  if (metrics) metrics->write(record.dump() + "\n");
}

// The dtype of the activations and of the weights the GEMMs read.
DType compute_dtype(const std::string& precision) {
  if (precision == "fp32") return DType::kFloat32;
  if (precision == "fp64") return DType::kFloat64;
  if (precision == "bf16") return DType::kBFloat16;
  if (precision == "fp16") return DType::kFloat16;
  throw ValueError("--precision " + precision + ": expected fp32, fp64, bf16 or fp16");
}
// The dtype of the master weights, the gradients and the optimizer state.
DType master_dtype(const std::string& precision) {
  return precision == "fp64" ? DType::kFloat64 : DType::kFloat32;
}

double evaluate(nn::Module& model, const Split& test) {
  NoGradGuard no_grad;
  model.eval();  // BatchNorm: running statistics; Dropout: off
  struct BackToTraining {
    nn::Module& m;
    ~BackToTraining() { m.train(); }
  } back{model};
  int64_t correct = 0;
  for (int64_t start = 0; start < test.size(); start += 1000) {
    const int64_t n = std::min<int64_t>(1000, test.size() - start);
    correct +=
        count_equal(argmax(model(test.images.narrow(start, n))), test.labels.narrow(start, n));
  }
  return test.size() ? static_cast<double>(correct) / static_cast<double>(test.size()) : 0.0;
}

// A progress bar on a terminal, a plain line every tenth of an epoch otherwise.
class Progress {
 public:
  void set_steps_per_epoch(int64_t steps) {
    total_ = steps;
    every_ = std::max<int64_t>(1, steps / 10);
  }
  Progress(std::ostream& out, bool quiet, int64_t steps_per_epoch)
      : out_(out),
        quiet_(quiet),
        tty_(isatty(STDOUT_FILENO) && &out == &std::cout),
        every_(std::max<int64_t>(1, steps_per_epoch / 10)),
        total_(steps_per_epoch) {}
  void update(int64_t epoch, int64_t step_in_epoch, const optim::StepResult& r, double rate) {
    if (quiet_) return;
    if (tty_) {
      if (seconds_since(last_) < 0.1 && step_in_epoch != total_) return;
      last_ = Clock::now();
      const int width = 30;
      const int filled = static_cast<int>(width * step_in_epoch / std::max<int64_t>(total_, 1));
      out_ << "\repoch " << epoch + 1 << " [" << std::string(filled, '=')
           << std::string(width - filled, ' ') << "] " << step_in_epoch << "/" << total_ << " loss "
           << std::fixed << std::setprecision(4) << r.loss << " " << std::setprecision(0) << rate
           << " samples/s   " << std::flush;
    } else if (step_in_epoch % every_ == 0 || step_in_epoch == total_) {
      out_ << "epoch " << epoch + 1 << " step " << r.step << " (" << step_in_epoch << "/" << total_
           << ") loss " << std::fixed << std::setprecision(4) << r.loss << " grad_norm "
           << r.grad_norm << " lr " << std::scientific << std::setprecision(2) << r.lr << std::fixed
           << " " << std::setprecision(0) << rate << " samples/s\n";
    }
  }
  void end_epoch() {
    if (tty_ && !quiet_) out_ << "\n";
  }

 private:
  std::ostream& out_;
  bool quiet_, tty_;
  int64_t every_, total_;
  Clock::time_point last_ = Clock::now();
};

std::unique_ptr<nn::Module> make_model(const Config& c, int64_t pixels, DType dtype) {
  if (c.model == "cnn") {
    if (pixels != 28 * 28) {
      throw FileError(
          str_cat("--model cnn needs 28 x 28 images, the data has ", pixels, " pixels per image"));
    }
    return std::make_unique<nn::MnistCNN>(nn::MnistCNN::parse_norm(c.norm), dtype);
  }
  std::vector<int64_t> sizes{pixels};
  sizes.insert(sizes.end(), c.hidden.begin(), c.hidden.end());
  sizes.push_back(10);
  return std::make_unique<nn::MLP>(sizes, nn::activation<nn::ReLU>(), dtype);
}

// What --save writes: the master parameters, then the model's buffers (running statistics).
std::vector<nn::NamedTensor> saved_state(optim::ParameterArena& arena, const nn::Module& model) {
  std::vector<nn::NamedTensor> state = arena.named_masters();
  for (auto& b : model.named_buffers()) state.push_back(b);
  return state;
}

// FNV-1a over the bytes of every parameter, in order (read back to the host).
uint64_t parameter_hash(const std::vector<nn::NamedTensor>& params) {
  uint64_t h = 1469598103934665603ull;
  for (auto& [name, p] : params) {
    const Tensor host = p.to(Device::cpu());
    const auto* bytes = static_cast<const unsigned char*>(host.raw());
    for (size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

// One micro-step of the first b training samples, forward and backward, for --memory-budget:
// returns its activation peak (bytes above the live bytes before it). The gradients it leaves
// are zeroed and BatchNorm's running statistics restored, so training starts as without it.
size_t probe_micro_step(nn::Module& model, optim::ParameterArena& arena, const Split& train,
                        DType loss_dtype, int64_t b) {
  b = std::min<int64_t>(b, train.size());
  std::vector<Tensor> buffers;
  for (const auto& [name, t] : model.named_buffers()) buffers.push_back(t.clone());
  std::vector<int32_t> first(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) first[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const Tensor index = Tensor::from_vector<int32_t>({b}, first, train.images.device());
  CachingAllocator& alloc = allocator_for(train.images.device());
  const size_t before = alloc.stats().live_bytes;
  alloc.reset_peak();
  {
    const nn::SampleKeys keys(0, 0, index);
    const Tensor logits = cast(model(gather_rows(train.images, index)), loss_dtype);
    backward(cross_entropy(logits, gather_rows(train.labels, index)), 1.0 / static_cast<double>(b));
  }
  const size_t peak = alloc.stats().peak_bytes - before;
  arena.zero_grad();
  size_t i = 0;
  for (auto& [name, t] : model.named_buffers()) t.copy_(buffers[i++]);
  return peak;
}

// An epoch's batch: its resolved sizes, its windows and its learning rate (before the schedule).
struct EpochPlan {
  optim::ResolvedBatch batch;
  std::vector<optim::Window> windows;
  double lr;
};

}  // namespace

LossScaleChoice resolve_loss_scale(const std::string& loss_scale, const std::string& precision) {
  LossScaleChoice out;
  if (loss_scale == "none" || (loss_scale == "auto" && precision != "fp16")) return out;
  out.on = true;
  if (loss_scale == "dynamic" || loss_scale == "auto") {
    out.dynamic = true;
    out.initial = 65536.0;  // 2^16, as torch.amp.GradScaler
    return out;
  }
  char* end = nullptr;
  out.initial = std::strtod(loss_scale.c_str(), &end);
  if (loss_scale.empty() || end != loss_scale.c_str() + loss_scale.size() ||
      !std::isfinite(out.initial) || !(out.initial > 0)) {
    throw ValueError("--loss-scale " + loss_scale +
                     ": expected auto, none, dynamic or a positive number");
  }
  return out;
}

Summary train(const Config& config, std::ostream& out) {
  Config c = config;
  // Data parallel: every rank trains; rank 0 alone prints, writes metrics and saves. Each rank
  // takes the GPU of its local rank when the device is CUDA.
  const distributed::LaunchInfo launch = distributed::launch_info();
  if (c.device.is_cuda() && c.comm == nullptr && launch.world_size > 1) {
    // One GPU per rank. Under srun --gpus-per-task each rank sees one GPU: its cuda:0.
    const int visible = cuda_device_count();
    if (visible > 1 && launch.local_rank >= visible) {
      throw DeviceError(str_cat("rank ", launch.rank, " has local rank ", launch.local_rank,
                                " but this node shows ", visible, " GPUs: one GPU per rank"));
    }
    c.device = Device::cuda(visible == 1 ? 0 : launch.local_rank);
  }
  distributed::Communicator& comm = c.comm != nullptr ? *c.comm : distributed::world_for(c.device);
  const bool lead = comm.rank() == 0;
  if (!lead) c.quiet = true;
  // --threads N fixes the team; 0 lets the tuner pick among 1, 2, 4, ..., every core by timing
  // windows as they run (core/threads.h). Either way the weights are the same to the bit.
  std::optional<ThreadTuner> tuner;
  if (c.threads > 0) {
    set_cpu_threads(c.threads);
  } else {
    tuner.emplace(ThreadTuner::default_candidates(cpu_cores()));
  }
  const auto log = [&](const std::string& line) {
    if (!c.quiet) out << line << "\n";
  };
  const DType dtype = compute_dtype(c.precision);
  const DType master = master_dtype(c.precision);
  const LossScaleChoice scaling = resolve_loss_scale(c.loss_scale, c.precision);
  const Split train_set = load_split(c.data, "train", c.train_limit, c.device, dtype);
  const Split test_set = load_split(c.data, "t10k", 0, c.device, dtype);
  if (test_set.images.size(1) != train_set.images.size(1)) {
    throw FileError(str_cat(test_set.image_path, ": images have ", test_set.images.size(1),
                            " pixels but the training images (", train_set.image_path, ") have ",
                            train_set.images.size(1)));
  }

  // What the model, its arena and its optimizer hold is measured from here.
  const size_t device_bytes_before = allocator_for(c.device).stats().live_bytes;
  const size_t host_bytes_before = pinned_host_allocator().stats().live_bytes;
  nn::manual_seed(c.seed);
  std::unique_ptr<nn::Module> model_owner = make_model(c, train_set.images.size(1), master);
  nn::Module& model = *model_owner;
  if (!c.init.empty()) optim::load_parameters(model, c.init);
  model.to(c.device);
  // --zero 1 pads the arena to equal shards and keeps this rank's shard of the state only.
  optim::ParameterArena arena(model, c.zero ? comm.world_size() : 1);
  if (dtype != master) arena.use_working_copy(dtype);
  if (c.offload_optimizer) arena.offload_masters();

  // --memory-budget: the optimizer's state is allocated first (it is part of the baseline),
  // then probe micro-steps pick the micro-batch; everything after sees it in c.
  std::unique_ptr<optim::Optimizer> optimizer;
  std::optional<BudgetDecision> budget;
  if (!c.memory_budget.empty()) {
    const int64_t batch_size = c.batch > 0 ? c.batch : 128;
    optimizer = make_optimizer(
        c, arena,
        optim::scale_lr(c.lr, batch_size, c.base_batch, optim::parse_lr_scaling(c.lr_scaling)));
    if (batch_size % comm.world_size() != 0) {
      throw ValueError(
          str_cat("--batch ", batch_size, " does not split over ", comm.world_size(), " ranks"));
    }
    budget = fit_micro_batch(parse_bytes(c.memory_budget), batch_size / comm.world_size(),
                             allocator_for(c.device).stats().live_bytes, [&](int64_t b) {
                               return probe_micro_step(model, arena, train_set, master, b);
                             });
    c.batch = batch_size;
    c.micro_batch = budget->micro_batch;
    c.accum_steps = 0;
    log(budget->str(parse_bytes(c.memory_budget), batch_size));
  }
  // The batch plan of each epoch: one for the whole run, or, with --accum-schedule, one per k.
  const std::optional<optim::AccumSchedule> k_schedule =
      c.accum_schedule.empty() ? std::nullopt
                               : std::optional<optim::AccumSchedule>(
                                     optim::AccumSchedule::parse(c.accum_schedule, INT32_MAX));
  const optim::LrScaling lr_rule = optim::parse_lr_scaling(c.lr_scaling);
  std::map<int64_t, EpochPlan> plans;                             // by k
  const auto plan_for = [&](int64_t epoch) -> const EpochPlan& {  // epoch: 0-based
    Config ce = c;
    if (k_schedule) {
      ce.accum_steps = k_schedule->k_at(epoch + 1);
      ce.batch = 0;
    }
    const optim::ResolvedBatch b = resolve_config_batch(ce, comm.world_size());
    auto it = plans.find(b.accum_steps);
    if (it == plans.end()) {
      it = plans
               .emplace(b.accum_steps,
                        EpochPlan{b,
                                  optim::plan_windows(train_set.size(), b,
                                                      optim::LastWindow::kFlush, comm.rank()),
                                  optim::scale_lr(c.lr, b.batch, c.base_batch, lr_rule)})
               .first;
    }
    return it->second;
  };
  const optim::ResolvedBatch batch = plan_for(0).batch;
  const double lr = plan_for(0).lr;
  if (!optimizer) optimizer = make_optimizer(c, arena, lr);
  // The pieces around the one-process optimizer: ZeRO-1 shards it, several replicated ranks
  // all-reduce the gradient, an offloaded optimizer on one rank copies it to the host.
  std::unique_ptr<distributed::ZeroOptimizerState> zero;
  std::unique_ptr<distributed::GradientAllReduce> all_reduce;
  if (c.zero) {
    zero = std::make_unique<distributed::ZeroOptimizerState>(*optimizer, comm);
  } else if (comm.world_size() > 1) {
    all_reduce = std::make_unique<distributed::GradientAllReduce>(arena, comm);
  }
  if (scaling.on) {
    optim::LossScaling ls;
    ls.dynamic = scaling.dynamic;
    optimizer->set_loss_scaling(ls, scaling.initial);
  }
  int64_t total_steps = 0;
  for (int64_t e = 0; e < c.epochs && total_steps < INT64_MAX; ++e) {
    const int64_t n = static_cast<int64_t>(plan_for(e).windows.size());
    if (__builtin_add_overflow(total_steps, n, &total_steps)) total_steps = INT64_MAX;
    if (!k_schedule && __builtin_mul_overflow(n, c.epochs, &total_steps)) total_steps = INT64_MAX;
    if (!k_schedule) break;  // every epoch alike
  }
  if (c.max_steps > 0) total_steps = std::min(total_steps, c.max_steps);
  optim::AccumulatorOptions options;
  options.max_norm = c.clip;
  options.base_lr = lr;
  options.schedule = {optim::Schedule::parse(c.schedule), c.warmup, total_steps, 0.0};
  if (zero) {
    options.gradients = zero.get();
    options.loss_reducer = zero.get();
  } else if (all_reduce) {
    options.gradients = all_reduce.get();
    options.loss_reducer = all_reduce.get();
  } else {
    options.gradients = optimizer->offload();  // null unless offloaded
  }
  const int64_t bucket_kib =
      c.bucket_kib >= 0 ? c.bucket_kib : (c.offload_optimizer && comm.world_size() == 1 ? 1024 : 0);
  options.bucket_bytes = static_cast<size_t>(bucket_kib) * 1024;
  optim::Accumulator acc(*optimizer, options);

  // What a resume must match to continue this run bit for bit.
  const nlohmann::json run_config = {{"model", c.model},
                                     {"norm", c.norm},
                                     {"hidden", c.hidden},
                                     {"precision", c.precision},
                                     {"loss_scale", c.loss_scale},
                                     {"optimizer", c.optimizer},
                                     {"weight_decay", c.weight_decay},
                                     {"momentum", c.momentum},
                                     {"lr", c.lr},
                                     {"lr_scaling", c.lr_scaling},
                                     {"base_batch", c.base_batch},
                                     {"schedule", c.schedule},
                                     {"warmup", c.warmup},
                                     {"clip", c.clip},
                                     {"batch", batch.batch},
                                     {"micro_batch", batch.micro_batch},
                                     {"accum_steps", k_schedule ? 0 : batch.accum_steps},
                                     {"accum_schedule", c.accum_schedule},
                                     {"ranks", comm.world_size()},
                                     {"zero", c.zero},
                                     {"seed", c.seed},
                                     {"shuffle", c.shuffle},
                                     {"train_samples", train_set.size()}};
  TrainPosition start;
  if (!c.resume.empty()) {
    const Checkpoint saved = read_latest_checkpoint(c.resume);
    check_compatible(saved.config, run_config, saved.path);
    // The masters and buffers, then the working copy from the masters (what it always is).
    auto state = arena.named_masters();
    for (auto& b : model.named_buffers()) state.push_back(b);
    for (auto& [name, t] : state) {
      const auto it = saved.model.find(name);
      if (it == saved.model.end() || it->second.shape() != t.shape() ||
          it->second.dtype() != t.dtype()) {
        throw FileError(str_cat(saved.path, ": the checkpoint's '", name, "' is ",
                                it == saved.model.end() ? "missing" : it->second.describe(),
                                ", the model's is ", t.describe()));
      }
      t.copy_(it->second.to(t.device()));
    }
    if (arena.working().defined()) {
      arena.working().copy_(to_dtype(arena.params(), arena.working().dtype()));
    }
    optimizer->load_state(saved.optimizer);
    acc.restore_clock(saved.position.step, saved.position.skipped);
    start = saved.position;
    log(str_cat("resumed from ", saved.path, ": step ", start.step, ", epoch ", start.epoch + 1,
                ", window ", start.window + 1));
  }
  // Writes a checkpoint of the state after `step` windows (every rank takes part: a sharded
  // optimizer gathers its state; rank 0 writes).
  int64_t last_checkpoint = -1;
  const auto checkpoint = [&](const TrainPosition& position) {
    if (c.checkpoint.empty() || position.step == last_checkpoint) return;
    auto optimizer_state = optimizer->save_state();
    if (lead) {
      write_checkpoint(c.checkpoint, run_config, position, saved_state(arena, model),
                       optimizer_state);
    }
    if (comm.world_size() > 1) comm.barrier();  // no rank reads it before it is complete
    last_checkpoint = position.step;
  };

  std::unique_ptr<AtomicFile> metrics;
  if (!c.metrics.empty() && lead) metrics = std::make_unique<AtomicFile>(c.metrics);
  log("accrue-mnist: " + batch.str() + ", lr " + std::to_string(lr) + " (" + c.lr_scaling +
      " scaling)" + (k_schedule ? ", accumulation schedule " + k_schedule->str() : "") + ", " +
      std::to_string(model.num_parameters()) + " parameters, device " + c.device.str() + ", " +
      std::to_string(train_set.size()) + " training samples");

  Summary summary;
  // The training state's bytes, now that the optimizer exists.
  summary.device_state_bytes = allocator_for(c.device).stats().live_bytes - device_bytes_before;
  summary.host_state_bytes = pinned_host_allocator().stats().live_bytes - host_bytes_before;
  int64_t samples_seen = 0;
  Progress progress(out, c.quiet, static_cast<int64_t>(plan_for(0).windows.size()));
  TrainPosition position = start;
  for (int64_t epoch = start.epoch; epoch < c.epochs && acc.steps() < total_steps; ++epoch) {
    const EpochPlan& plan = plan_for(epoch);
    const std::vector<optim::Window>& windows = plan.windows;
    if (k_schedule &&
        (epoch == 0 || plan.batch.accum_steps != plan_for(epoch - 1).batch.accum_steps)) {
      log(str_cat("epoch ", epoch + 1, ": ", plan.batch.str(), ", lr ", plan.lr));
    }
    acc.set_base_lr(plan.lr);
    progress.set_steps_per_epoch(static_cast<int64_t>(windows.size()));
    const auto order_host = epoch_order(train_set.size(), c.seed, epoch, c.shuffle);
    const Tensor order = Tensor::from_vector<int32_t>({train_set.size()}, order_host, c.device);
    const auto epoch_start = Clock::now();
    int64_t step_in_epoch = 0;
    double epoch_loss = 0;
    int64_t epoch_samples = 0;
    const size_t first_window = epoch == start.epoch ? static_cast<size_t>(start.window) : 0;
    for (size_t wi = first_window; wi < windows.size(); ++wi) {
      const optim::Window& w = windows[wi];
      if (tuner) set_cpu_threads(tuner->next());
      const auto window_start = Clock::now();
      const optim::StepResult r = acc.run_window(w, [&](const optim::MicroBatch& mb) {
        const Tensor index = order.narrow(mb.start, mb.count);
        // Dropout's masks are keyed by the samples and the optimizer step, not the split.
        const nn::SampleKeys keys(c.seed, acc.steps(), index);
        // The softmax and the loss in float32 (or float64), whatever the activations are in.
        const Tensor logits = cast(model(gather_rows(train_set.images, index)), master);
        return cross_entropy(logits, gather_rows(train_set.labels, index));
      });
      if (tuner) tuner->record(seconds_since(window_start) / static_cast<double>(r.samples));
      samples_seen += r.samples;
      epoch_samples += r.samples;
      epoch_loss += r.loss * static_cast<double>(r.samples);
      summary.step_losses.push_back(r.loss);
      summary.step_grad_norms.push_back(r.grad_norm);
      summary.step_loss_scales.push_back(r.loss_scale);
      summary.step_batches.push_back(r.samples);
      ++step_in_epoch;
      if (r.skipped) {
        log(str_cat("step ", r.step, ": non-finite gradient, update skipped",
                    scaling.dynamic ? str_cat(" (loss scale ", r.loss_scale, " -> ",
                                              r.loss_scale * optim::LossScaling{}.backoff, ")")
                                    : ""));
      }
      emit(metrics, {{"step", r.step},
                     {"epoch", epoch + 1},
                     {"samples", samples_seen},
                     {"loss", number(r.loss)},
                     {"grad_norm", number(r.grad_norm)},
                     {"lr", r.lr},
                     {"skipped", r.skipped},
                     {"loss_scale", r.loss_scale},
                     {"k", plan.batch.accum_steps},
                     {"batch", plan.batch.batch},
                     {"threads", cpu_threads()}});
      const double elapsed = summary.train_seconds + seconds_since(epoch_start);
      progress.update(epoch, step_in_epoch, r, samples_seen / std::max(elapsed, 1e-9));
      const bool last = wi + 1 == windows.size();
      position = {acc.steps(), acc.skipped_steps(), last ? epoch + 1 : epoch,
                  last ? 0 : static_cast<int64_t>(wi + 1)};
      if (c.checkpoint_every > 0 && acc.steps() % c.checkpoint_every == 0) checkpoint(position);
      if (acc.steps() >= total_steps) break;
    }
    const double epoch_seconds = seconds_since(epoch_start);
    summary.train_seconds += epoch_seconds;
    progress.end_epoch();
    summary.test_accuracy = evaluate(model, test_set);
    std::ostringstream line;
    line << "epoch " << epoch + 1 << ": train loss " << std::fixed << std::setprecision(4)
         << epoch_loss / std::max<int64_t>(epoch_samples, 1) << ", test accuracy "
         << std::setprecision(2) << 100 * summary.test_accuracy << "%, " << std::setprecision(2)
         << epoch_seconds << " s";
    log(line.str());
    emit(metrics, {{"event", "epoch"},
                   {"epoch", epoch + 1},
                   {"train_loss", number(epoch_loss / std::max<int64_t>(epoch_samples, 1))},
                   {"test_accuracy", summary.test_accuracy},
                   {"seconds", epoch_seconds}});
  }
  checkpoint(position);  // the end of the run, unless that step was just written
  summary.steps = acc.steps();
  summary.skipped_steps = acc.skipped_steps();
  summary.final_loss_scale = optimizer->scaler_state().first;
  summary.peak_activation_bytes = acc.memory().peak_activation_bytes;
  summary.peak_bytes = acc.memory().peak_bytes;
  summary.micro_batch = batch.micro_batch;
  if (budget) {
    summary.activation_bytes_per_sample = budget->per_sample;
    summary.activation_fixed_bytes = budget->fixed;
    summary.memory_baseline_bytes = budget->baseline;
  }
  summary.samples_per_second = samples_seen / std::max(summary.train_seconds, 1e-9);
  const optim::MemoryStats& mem = acc.memory();
  std::string offload_line;
  if (const optim::HostOffload* off = optimizer->offload()) {
    summary.offload = off->traffic();
    const auto per_step = [&](size_t bytes) {
      return mib(bytes / static_cast<size_t>(std::max<int64_t>(summary.offload.steps, 1)));
    };
    offload_line = str_cat(
        " | offloaded: training state ", mib(summary.device_state_bytes), " on ", c.device.str(),
        ", ", mib(summary.host_state_bytes), " pinned on the host; per step ",
        per_step(summary.offload.to_host_bytes), " to the host (", summary.offload.prefetched,
        " copies during backward, ", summary.offload.fetched_at_step, " at the boundary), ",
        per_step(summary.offload.from_host_bytes), " back");
  }
  std::ostringstream line;
  line << "done: test accuracy " << std::fixed << std::setprecision(2)
       << 100 * summary.test_accuracy << "% after " << summary.steps << " steps | train "
       << summary.train_seconds << " s, " << std::setprecision(0) << summary.samples_per_second
       << " samples/s | "
       << (k_schedule ? str_cat("accumulation schedule ", k_schedule->str(), ", micro-batch ",
                                batch.micro_batch)
                      : batch.str())
       << " | device " << c.device.str() << " | peak " << mib(mem.peak_bytes) << ", activations "
       << mib(mem.peak_activation_bytes) << ", optimizer state " << mib(optimizer->state_bytes())
       << (comm.world_size() > 1 ? " per rank" : "") << offload_line << " | " << c.precision
       << (scaling.on ? str_cat(", loss scale ", optimizer->scaler_state().first) : "")
       << " | skipped steps " << acc.skipped_steps() << " | "
       << (tuner ? tuner->describe() : std::to_string(c.threads) + " threads (fixed)");
  log(line.str());
  emit(metrics, {{"event", "summary"},
                 {"test_accuracy", summary.test_accuracy},
                 {"train_seconds", summary.train_seconds},
                 {"samples_per_second", summary.samples_per_second},
                 {"steps", summary.steps},
                 {"skipped_steps", acc.skipped_steps()},
                 {"peak_bytes", mem.peak_bytes},
                 {"peak_activation_bytes", mem.peak_activation_bytes},
                 {"optimizer_state_bytes", optimizer->state_bytes()},
                 {"device_state_bytes", summary.device_state_bytes},
                 {"host_state_bytes", summary.host_state_bytes},
                 {"offload_optimizer", c.offload_optimizer},
                 {"offload_to_host_bytes", summary.offload.to_host_bytes},
                 {"offload_from_host_bytes", summary.offload.from_host_bytes},
                 {"ranks", comm.world_size()},
                 {"zero", c.zero},
                 {"batch", batch.batch},
                 {"micro_batch", batch.micro_batch},
                 {"accum_steps", batch.accum_steps},
                 {"device", c.device.str()},
                 {"precision", c.precision},
                 {"model", c.model},
                 {"norm", c.norm},
                 {"loss_scale", summary.final_loss_scale},
                 {"threads", cpu_threads()},
                 {"thread_switches", tuner ? tuner->switches() : 0}});
  if (metrics) metrics->commit();
  if (summary.steps > 0 && summary.skipped_steps == summary.steps) {
    throw std::runtime_error(str_cat("no update was applied: all ", summary.steps,
                                     " steps were skipped (non-finite gradients)",
                                     c.save.empty() ? "" : "; nothing saved"));
  }
  summary.parameter_hash = parameter_hash(arena.named_masters());
  summary.buckets_overlapped = acc.buckets_overlapped();
  summary.buckets_at_step = acc.buckets_at_step();
  if (!c.save.empty() && lead) {
    optim::save_safetensors(c.save, saved_state(arena, model), {{"format", "pt"}});
    log("saved weights to " + c.save);
  }
  return summary;
}

namespace {

// With several ranks, a failure on one must end them all, at once, rather than leave the others
// waiting in the next all-reduce: the message names the rank, then the communicator aborts.
int fail(std::ostream& err, const std::string& message, int code) {
  distributed::LaunchInfo info;
  try {
    info = distributed::launch_info();
  } catch (const std::exception&) {
  }
  err << "accrue-mnist: " << (info.world_size > 1 ? str_cat("rank ", info.rank, ": ") : "")
      << message << "\n"
      << std::flush;
  if (info.world_size > 1) {
    try {
      distributed::world().abort(code);
    } catch (const std::exception&) {
    }
  }
  return code;
}

}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  Config config;
  const int status = parse_args(argc, argv, config, out, err);
  if (status >= 0) return status;
  try {
    train(config, out);
  } catch (const FileError& e) {
    std::string message = e.what();
    if (!std::filesystem::exists(config.data + "/train-images-idx3-ubyte")) {
      message += "\naccrue-mnist: fetch the data with scripts/fetch-mnist.sh " + config.data;
    }
    return fail(err, message, 1);
  } catch (const std::exception& e) {
    return fail(err, e.what(), 1);
  }
  return 0;
}

}  // namespace accrue::mnist
