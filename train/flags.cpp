// The engine's command-line flags (see flags.h), declared once with CLI11: every flag with its
// default in --help; a mistake prints one line and exits with status 2.
#include "train/flags.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>

#include "core/error.h"
#include "core/file.h"
#include "kernels/profile.h"
#include "optim/registry.h"
#include "optim/schedule.h"
#include "train/budget.h"
#include "train/checkpoint.h"
#include "train/run.h"
#include "train/strategies.h"

namespace accrue::train {

namespace {

// Which ends of a finite_in interval are excluded.
enum class Open { kNeither, kLow, kHigh };

// A CLI11 check: a finite number in [low, high], with one end excluded when `open` says so. The
// message is one short line naming the value (never DBL_MAX in 309 digits).
CLI::Validator finite_in(double low, double high, Open open = Open::kNeither) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        if (text == "nan" || text == "inf" || text == "-inf") {
          return "'" + text + "' is not a finite number";
        }
        const std::optional<double> number = decimal_number(text);
        if (!number) {
          return "'" + text + "' is not a number in decimal notation (or too small to tell from 0)";
        }
        const double v = *number;
        if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
        const bool above = open == Open::kLow ? v > low : v >= low;
        const bool below = open == Open::kHigh ? v < high : v <= high;
        if (above && below) return "";
        const char* from = open == Open::kLow ? "(" : "[";
        if (high == std::numeric_limits<double>::max()) {
          return str_cat("'", text, "' must be ", open == Open::kLow ? "> " : ">= ", low);
        }
        return str_cat("'", text, "' must be in ", from, low, ", ", high,
                       open == Open::kHigh ? ")" : "]");
      },
      "");
}

// A CLI11 check: a decimal integer in [0, 2^64 - 1] (a seed: never wrapped).
CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        const unsigned long long v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
        if (!digits || errno == ERANGE) {
          return str_cat("'", text, "' is not an integer in [0, 18446744073709551615]");
        }
        text = std::to_string(v);  // decimal, never octal
        return "";
      },
      "");
}

constexpr double kHuge = std::numeric_limits<double>::max();

// What a path names, following links (not_found when nothing is there); a path that cannot be
// resolved (a symbolic link loop, a component that is no folder, no permission) throws
// ValueError naming the flag, the path and the system's reason.
std::filesystem::file_type input_kind(const char* flag, const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (ec && status.type() != std::filesystem::file_type::not_found) {
    throw ValueError(str_cat(flag, " ", path, ": ", ec.message()));
  }
  return status.type();
}

}  // namespace

namespace {

// "adam, adamw, sgd": the registered optimizers' names.
std::string names_of_optimizers() {
  std::string names;
  for (const std::string& name : optim::optimizer_names()) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

}  // namespace

CLI::Validator int_in(int64_t low, int64_t high) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const std::optional<int64_t> v = decimal_integer(text);
        if (!v || *v < low || *v > high) {
          return str_cat("'", text, "' is not an integer in [", low, ", ", high, "]");
        }
        text = std::to_string(*v);  // "010" is ten: CLI11 would read a leading 0 as octal
        return "";
      },
      "");
}

Flags::Flags(CLI::App& app, Config& config) : app_(app), c_(config) {
  app_.option_defaults()->always_capture_default();
  add_device_flags();
  add_batch_flags();
  add_optimizer_flags();
  add_parallel_flags();
  add_output_flags();
}

// Where the run computes and in which precision.
void Flags::add_device_flags() {
  device_ = cuda_device_count() > 0 ? "cuda" : "cpu";
  app_.add_option("--device", device_, "cpu or cuda[:N] (default: cuda when present)");
  app_.add_option("--cuda-graphs", cuda_graphs_,
                  "Capture each micro-step shape and the boundary step as CUDA graphs and replay "
                  "them: auto (on a GPU), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  precision_ = precision_name(c_.precision);
  loss_scale_ = c_.loss_scale.str();
  app_.add_option("--precision", precision_,
                  "fp32; fp64 (everything in float64, for exactness studies); bf16 or fp16 (mixed: "
                  "16-bit activations, float32 master weights, gradients and optimizer state)")
      ->check(CLI::IsMember({"fp32", "fp64", "bf16", "fp16"}));
  app_.add_option("--loss-scale", loss_scale_,
                  "auto (dynamic for fp16, none otherwise), none, dynamic, or a fixed scale");
}

// The batch, its accumulation, the epochs and the learning rate's schedule.
void Flags::add_batch_flags() {
  app_.add_option("--micro-batch", c_.micro_batch, "Samples per micro-step b (default 32)")
      ->transform(int_in(0, kMaxBatch));
  app_.add_option("--accum-steps", c_.accum_steps, "Micro-steps per optimizer step k (default 4)")
      ->transform(int_in(0, kMaxBatch));
  if (c_.accum_schedule) accum_schedule_ = c_.accum_schedule->str();
  lr_scaling_ = optim::lr_scaling_name(c_.lr_scaling);
  schedule_ = optim::schedule_name(c_.schedule);
  app_.add_option("--accum-schedule", accum_schedule_,
                  "k by epoch, e.g. 1:1,2:2,3:4,5:8 (the effective batch follows; excludes "
                  "--accum-steps and --batch)");
  app_.add_option("--memory-budget", memory_budget_,
                  "Device bytes a run may use (e.g. 64MiB, 1GiB): the largest micro-batch that "
                  "fits is measured and chosen; k follows from --batch");
  app_.add_option("--batch", c_.batch, "Effective batch B = b * k (give any two of the three)")
      ->transform(int_in(0, kMaxBatch));
  app_.add_option("--epochs", c_.epochs, "Passes over the training set")
      ->transform(int_in(1, kMaxEpochs));
  app_.add_option("--max-steps", c_.max_steps, "Stop after this many optimizer steps (0: no limit)")
      ->transform(int_in(0, INT64_MAX));
  app_.add_option("--train-limit", c_.train_limit,
                  "Train on N samples (0: all): the first N (G2P: N sequences drawn with --seed)")
      ->transform(int_in(0, INT32_MAX));
  app_.add_option("--lr", c_.lr, "Learning rate at --base-batch")
      ->check(finite_in(0, kHuge, Open::kLow));
  app_.add_option("--lr-scaling", lr_scaling_, "Scale lr with the batch: none, linear, sqrt")
      ->check(CLI::IsMember({"none", "linear", "sqrt"}));
  app_.add_option("--base-batch", c_.base_batch, "Batch size --lr was tuned for")
      ->transform(int_in(1, kMaxBatch));
  app_.add_option("--schedule", schedule_,
                  "LR schedule after the warmup: constant, or cosine decay to 0 at the last step")
      ->check(CLI::IsMember({"constant", "cosine"}));
  app_.add_option("--warmup", c_.warmup,
                  "Optimizer steps of linear warmup before either schedule (0: none)")
      ->transform(int_in(0, INT32_MAX));
  app_.add_option("--clip", c_.clip, "Clip the gradient norm to this (0: off)")
      ->check(finite_in(0, kHuge));
}

// The optimizer (from the registry), the seed and the sample order, the CPU threads.
void Flags::add_optimizer_flags() {
  // The registered optimizers (optim/registry.h), named where they are described.
  std::string optimizers, decays;
  for (const std::string& name : optim::optimizer_names()) {
    const optim::OptimizerKind& kind = optim::optimizer_kind(name);
    optimizers += str_cat(optimizers.empty() ? "" : "; ", name, ": ", kind.help);
    decays += str_cat(decays.empty() ? "" : ", ", kind.default_weight_decay, " for ", name);
  }
  app_.add_option("--optimizer", c_.optimizer, optimizers)
      ->check(CLI::Validator(
          [](std::string& name) -> std::string {
            for (const std::string& known : optim::optimizer_names()) {
              if (name == known) return "";
            }
            return str_cat("'", name, "' is not one of ", names_of_optimizers());
          },
          ""));
  if (c_.weight_decay) weight_decay_ = str_cat(*c_.weight_decay);
  // The optimizers apply the decay in the parameters' type: past float32's range it is inf.
  app_.add_option("--weight-decay", weight_decay_, "Weight decay (default: " + decays + ")")
      ->check(finite_in(0, std::numeric_limits<float>::max()));
  app_.add_option("--momentum", c_.momentum, "SGD momentum")->check(finite_in(0, 1, Open::kHigh));
  app_.add_option("--seed", c_.seed, "Seed for initialisation and shuffling")
      ->transform(unsigned_64());
  app_.add_flag("--no-shuffle", no_shuffle_, "Keep the file order of the samples");
  app_.add_option("--threads", c_.threads,
                  "CPU threads (0: tuned while training among 1, 2, 4, ..., every core)")
      ->transform(int_in(0, 4096));
}

// How the run spreads over ranks and devices (strategies.h).
void Flags::add_parallel_flags() {
  app_.add_option("--zero", c_.zero,
                  "Shard over the data-parallel ranks: 1 the optimizer state, 2 the gradients "
                  "too, 3 the parameters too (ZeRO stages; docs/zero.md)")
      ->transform(int_in(0, 3));
  if (c_.zero_reduce) zero_reduce_ = distributed::zero_reduce_name(*c_.zero_reduce);
  app_.add_option("--zero-reduce", zero_reduce_,
                  "With --zero 2: reduce-scatter the gradient at the boundary (the whole "
                  "gradient accumulated, traffic once a window; the default) or at every "
                  "micro-step (only this rank's shard kept between windows, traffic k times)")
      ->check(CLI::IsMember({"boundary", "micro-step"}));
  if (c_.zero_prefetch) zero_prefetch_ = distributed::zero_prefetch_name(*c_.zero_prefetch);
  app_.add_option("--zero-prefetch", zero_prefetch_,
                  "With --zero 3: which layers' gathers start a layer ahead, to run while the "
                  "layer before computes: 'forward' (the default: holds two layers' parameters, "
                  "as the backward does anyway), 'forward-and-backward' (one more layer held "
                  "during the backward) or 'none' (every gather on demand)")
      ->check(CLI::IsMember({"none", "forward", "forward-and-backward"}));
  app_.add_option("--pipeline", c_.pipeline,
                  "Cut the model's layers into this many stages on as many ranks and schedule "
                  "each window's micro-batches through them (needs --accum-steps >= it)")
      ->transform(int_in(1, 1024));
  pipeline_schedule_ = distributed::schedule_name(c_.pipeline_schedule);
  app_.add_option("--pipeline-schedule", pipeline_schedule_,
                  "gpipe (every forward, then every backward) or 1f1b (one forward, one "
                  "backward: at most --pipeline micro-batches in flight)")
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  if (c_.bucket_kib) bucket_kib_ = std::to_string(*c_.bucket_kib);
  app_.add_option("--bucket-kib", bucket_kib_,
                  "Overlap the boundary's transfer (the all-reduce with several ranks, the copy to "
                  "the host with --offload-optimizer) with the last backward, in buckets of this "
                  "many KiB (0: all at the boundary; default 0, or 1024 with --offload-optimizer "
                  "on one rank)")
      ->transform(int_in(0, 1 << 20));
  app_.add_flag("--offload-optimizer", c_.offload_optimizer,
                "Keep the float master weights and the optimizer state in pinned host memory and "
                "run the optimizer step on the CPU (ZeRO-Offload)");
}

// What the run writes and reads, and how it reports.
void Flags::add_output_flags() {
  app_.add_option("--metrics", c_.metrics, "Write JSON Lines metrics to this file");
  app_.add_option("--save", c_.save, "Save the final weights (safetensors)");
  app_.add_option("--init", c_.init, "Start from these weights (safetensors)");
  app_.add_option("--save-init", c_.save_init,
                  "Save the weights the first step starts from (safetensors), e.g. for a peer "
                  "framework to load");
  app_.add_option("--checkpoint", c_.checkpoint,
                  "Write the whole training state into this folder (the newest two are kept)");
  app_.add_option("--checkpoint-every", c_.checkpoint_every,
                  "Optimizer steps between checkpoints (and one at the end)")
      ->transform(int_in(1, INT64_MAX));
  app_.add_option("--resume", c_.resume,
                  "Continue from the newest checkpoint in this folder, bit for bit, with the "
                  "settings it records (docs/reliability.md lists what may change)");
  app_.add_option("--eval-every", c_.eval_every,
                  "Evaluate on the held-out split every N optimizer steps (besides each epoch's "
                  "end), recorded in the metrics")
      ->transform(int_in(1, INT64_MAX));
  app_.add_flag("--keep-best", c_.keep_best,
                "Keep the weights of the best held-out evaluation so far as "
                "<--checkpoint>/best.safetensors");
  app_.add_option("--early-stop", c_.early_stop,
                  "End the run after this many evaluations (--eval-every) without improvement")
      ->transform(int_in(1, INT32_MAX));
  app_.add_flag("--quiet", c_.quiet, "No progress output");
  app_.add_flag("--profile", c_.profile,
                "Print where the time went at exit: per backend primitive and per backward node "
                "(as ACCRUE_PROFILE=1; ACCRUE_PROFILE_JSON=path for a Chrome trace)");
  app_.add_option("--comm-timeout", c_.comm_timeout,
                  "Seconds a rank waits for the others in a collective before the job is aborted "
                  "naming the operation (0: wait forever)")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            const double v = decimal_number(text).value_or(-1);
            if (!std::isfinite(v) || !(v == 0 || (v >= 1 && v <= 1e9))) {
              return "'" + text + "' must be 0 (no limit) or seconds in [1, 1e9]";
            }
            return "";
          },
          ""));
}

// Every output before any data is read: each one writable where it points, and no two the same
// file (a device such as /dev/null may take several).
void Flags::check_outputs() {
  struct Output {
    std::string flag, path;
    bool stream;
  };
  std::vector<Output> outputs;
  if (!c_.metrics.empty()) {
    outputs.push_back(
        {"--metrics", c_.metrics, check_output(c_.metrics, "--metrics") == OutputKind::kStream});
  }
  if (!c_.save.empty()) {
    outputs.push_back({"--save", c_.save, check_output(c_.save, "--save") == OutputKind::kStream});
  }
  if (!c_.save_init.empty()) {
    outputs.push_back({"--save-init", c_.save_init,
                       check_output(c_.save_init, "--save-init") == OutputKind::kStream});
  }
  if (!c_.checkpoint.empty()) {
    check_checkpoint_folder(c_.checkpoint, c_.resume, c_.pipeline, c_.zero == 3);
    outputs.push_back({"--checkpoint", c_.checkpoint, false});
    // --keep-best writes DIR/best.safetensors: a file there that the resumed run did not write
    // (a fresh run, or a resume from another folder) is the user's, and stays.
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path best = fs::path(c_.checkpoint) / kBestWeights;
    const bool continues_here = !c_.resume.empty() && fs::equivalent(c_.resume, c_.checkpoint, ec);
    if (c_.keep_best && fs::symlink_status(best, ec).type() != fs::file_type::not_found &&
        !continues_here) {
      throw ValueError(str_cat("--keep-best: ", best.string(),
                               " exists and this run did not write it: move it, or choose another "
                               "--checkpoint folder"));
    }
    // Written through a link it may be (a resume continues its own): it must not reach the data.
    if (c_.keep_best) outputs.push_back({"--keep-best", best.string(), false});
  }
  // The profiler's trace, written at exit (kernels/profile.h), is an output like the others.
  const std::string trace = profile_trace_path();
  if ((c_.profile || profile_enabled()) && !trace.empty()) {
    outputs.push_back({"ACCRUE_PROFILE_JSON", trace,
                       check_output(trace, "ACCRUE_PROFILE_JSON") == OutputKind::kStream});
  }
  // Where a path leads: absolute, links resolved, "." and ".." and a trailing slash gone.
  const auto identity = [](const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path p = fs::weakly_canonical(fs::absolute(resolve_output(path)), ec);
    if (ec) p = fs::absolute(path);
    p = p.lexically_normal();
    return p.has_filename() ? p : p.parent_path();
  };
  // An output must not overwrite what the run reads (--init, the data) nor a file the checkpoint
  // writer owns in the --checkpoint or --resume folder (its step-* files and its lock).
  const std::vector<std::string> data = data_files_ ? data_files_() : std::vector<std::string>{};
  for (const Output& o : outputs) {
    if (o.flag == "--checkpoint" || o.stream) continue;
    const std::filesystem::path at = identity(o.path);
    if (!c_.init.empty() && at == identity(c_.init)) {
      throw ValueError(str_cat(o.flag, " ", o.path, " is the --init file ", c_.init));
    }
    for (const std::string& file : data) {
      std::error_code ec;  // the same file under any name: ./, a link, a hard link
      if (std::filesystem::equivalent(o.path, file, ec)) {
        throw ValueError(
            str_cat(o.flag, " ", o.path, " is the data file ", file, ", which the run reads"));
      }
    }
    for (const std::string& folder : {c_.checkpoint, c_.resume}) {
      if (o.flag == "--keep-best") break;  // the checkpoint writer's file, written by it
      const std::string name = at.filename().string();
      if (!folder.empty() && at.parent_path() == identity(folder) &&
          (name.rfind("step-", 0) == 0 || name == ".lock" || name == kBestWeights)) {
        throw ValueError(str_cat(o.flag, " ", o.path, ": ", name,
                                 " is the checkpoint writer's own file in ", folder));
      }
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      if (outputs[i].stream && outputs[j].stream) continue;
      if (identity(outputs[i].path) == identity(outputs[j].path)) {
        throw ValueError(str_cat(outputs[i].flag, " ", outputs[i].path, " and ", outputs[j].flag,
                                 " ", outputs[j].path, " name the same file"));
      }
    }
  }
}

// An empty value is a mistake (a variable that was never set), never "not given".
void Flags::check_no_empty_values() const {
  for (const CLI::Option* option : app_.get_options()) {
    if (option->count() == 0 || option->get_type_size() == 0) continue;
    for (const std::string& value : option->results()) {
      if (value.empty()) throw ValueError(option->get_name() + ": the value is empty");
    }
  }
}

// Every k the run will use -- one, or each of --accum-schedule's; with --memory-budget the
// micro-batch is measured later and only the effective batch is known here -- must divide over
// the launcher's ranks and scale --lr to a usable rate.
void Flags::check_batches(int world_size) const {
  std::vector<Config> variants{c_};
  if (c_.memory_budget) {
    if (c_.micro_batch > 0 || c_.accum_steps > 0 || c_.accum_schedule) {
      throw ValueError(
          "--memory-budget chooses the micro-batch; it excludes --micro-batch, --accum-steps "
          "and --accum-schedule");
    }
    variants.front().micro_batch = 1;  // any divisor: the batch and lr checks below
    if (variants.front().batch == 0) variants.front().batch = kDefaultBatch;
    // The budget picks the micro-batch and k: only --batch is the user's to change.
    check_batch_splits(variants.front().batch, world_size);
  }
  if (c_.accum_schedule) {
    if (c_.accum_steps > 0 || c_.batch > 0) {
      throw ValueError("--accum-schedule sets k by epoch; it excludes --accum-steps and --batch");
    }
    variants.clear();
    for (const auto& [epoch, k] : c_.accum_schedule->points) {
      Config v = c_;
      v.accum_steps = k;
      variants.push_back(v);
    }
  }
  for (const Config& v : variants) {
    const optim::ResolvedBatch batch = resolve_config_batch(v, world_size);
    check_pipeline_depth(c_.pipeline, batch.accum_steps,
                         str_cat("--accum-steps is ", batch.accum_steps));
    const double lr = run_lr(c_, batch.batch);
    // The optimizer applies the rate in float32: outside its normal range it is inf or 0.
    if (!std::isfinite(lr) || !(lr >= std::numeric_limits<float>::min()) ||
        lr > std::numeric_limits<float>::max()) {
      throw ValueError(str_cat(
          "--lr ", c_.lr, " scaled (", optim::lr_scaling_name(c_.lr_scaling),
          ") from --base-batch ", c_.base_batch, " to batch ", batch.batch, " gives ", lr,
          ", not a usable learning rate (float32's normal range: [",
          std::numeric_limits<float>::min(), ", ", std::numeric_limits<float>::max(), "])"));
    }
  }
}

// A flag given for a setting this run does not have would change nothing: a mistake, not a no-op.
void Flags::check_each_flag_takes_effect() const {
  const auto given = [&](const char* flag) { return app_.count(flag) > 0; };
  if (given("--momentum") && !optim::optimizer_kind(c_.optimizer).takes_momentum) {
    std::string takers;
    for (const std::string& name : optim::optimizer_names()) {
      if (optim::optimizer_kind(name).takes_momentum)
        takers += (takers.empty() ? "" : " or ") + name;
    }
    throw ValueError("--momentum applies to --optimizer " + takers + "; this run uses " +
                     c_.optimizer);
  }
  if (given("--checkpoint-every") && c_.checkpoint.empty()) {
    throw ValueError("--checkpoint-every needs --checkpoint DIR");
  }
  if (c_.keep_best && c_.checkpoint.empty()) {
    const bool recorded = std::find(taken_from_checkpoint_.begin(), taken_from_checkpoint_.end(),
                                    "--keep-best") != taken_from_checkpoint_.end();
    throw ValueError(str_cat("--keep-best", recorded ? " (the resumed run's)" : "",
                             " needs --checkpoint DIR (the best weights go to DIR/", kBestWeights,
                             ")", recorded ? "; or give --keep-best=false" : ""));
  }
  if (c_.early_stop > 0 && c_.eval_every == 0) {
    throw ValueError("--early-stop counts evaluations; it needs --eval-every N");
  }
  if (given("--pipeline-schedule") && c_.pipeline <= 1) {
    throw ValueError("--pipeline-schedule needs --pipeline 2 or more");
  }
  if (given("--base-batch") && c_.lr_scaling == optim::LrScaling::kNone) {
    throw ValueError("--base-batch applies to --lr-scaling linear or sqrt; this run's is none");
  }
}

// --resume names a folder and excludes --init, which names a file.
void Flags::check_inputs() const {
  if (!c_.resume.empty() &&
      input_kind("--resume", c_.resume) != std::filesystem::file_type::directory) {
    throw ValueError("--resume " + c_.resume + ": no such folder");
  }
  if (!c_.resume.empty() && !c_.init.empty()) {
    throw ValueError("--resume continues a run; it excludes --init");
  }
  if (!c_.init.empty()) {
    const std::filesystem::file_type kind = input_kind("--init", c_.init);
    if (kind == std::filesystem::file_type::not_found) {
      throw ValueError("--init " + c_.init + ": no such file");
    }
    if (kind != std::filesystem::file_type::regular) {
      throw ValueError("--init " + c_.init +
                       (kind == std::filesystem::file_type::directory
                            ? ": is a directory, not a weights file"
                            : ": is not a regular file (a device, a FIFO or a socket)"));
    }
  }
}

namespace {

// A flag's values as typed: "--lr 0.002", "--no-shuffle", "--hidden 64,32".
std::string flag_text(const std::string& name, const std::vector<std::string>& values) {
  std::string text = name;
  for (const std::string& v : values) {
    if (v != "true") text += " " + v;
  }
  return text;
}

// Whether two values of a flag are one: the same text, the same number ("1e-3", "0.001"), the
// same device ("cuda", "cuda:0").
bool same_values(const std::string& flag, const std::vector<std::string>& a,
                 const std::vector<std::string>& b) {
  if (a.size() != b.size()) return false;
  const auto canonical = [&](const std::string& v) {
    if (flag != "--device") return v;
    try {
      return Device::parse(v).str();
    } catch (const std::exception&) {
      return v;
    }
  };
  for (size_t i = 0; i < a.size(); ++i) {
    const std::optional<double> x = decimal_number(a[i]), y = decimal_number(b[i]);
    if (canonical(a[i]) != canonical(b[i]) && !(x && y && *x == *y)) return false;
  }
  return true;
}

}  // namespace

// --resume DIR: the flags the run was given come from its newest checkpoint, unless the command
// gives them (config.h ResumeRule). One that shapes the run given with another value -- or given
// where the run had the default -- is a difference; all of them are named in one message. A
// checkpoint without the record (written before it was kept, or by a run configured in code)
// changes nothing here: the engine compares the configurations.
void Flags::take_resumed_flags() {
  // A --resume that is no folder is check_inputs()' to report.
  if (c_.resume.empty() ||
      input_kind("--resume", c_.resume) != std::filesystem::file_type::directory) {
    return;
  }
  const nlohmann::json saved = recorded_flags(c_.resume);
  if (saved.empty()) return;
  std::vector<std::string> differences;
  for (auto it = saved.begin(); it != saved.end(); ++it) {
    if (app_.get_option_no_throw(it.key()) == nullptr) {
      differences.push_back(
          str_cat(flag_text(it.key(), *it), ", which this program does not have"));
    }
  }
  for (CLI::Option* option : app_.get_options()) {
    const std::string name = option->get_name();
    const ResumeRule rule = resume_rule(name);
    if (rule == ResumeRule::kOwn) continue;
    const auto it = saved.find(name);
    const bool recorded = it != saved.end(), is_flag = option->get_expected_min() == 0;
    // What the run had: the recorded values, else the default (a flag not given is off).
    const std::vector<std::string> run =
        recorded ? it->get<std::vector<std::string>>()
                 : std::vector<std::string>{is_flag ? "false" : option->get_default_str()};
    if (option->count() > 0) {
      if (rule == ResumeRule::kShapes && !same_values(name, option->results(), run)) {
        differences.push_back(str_cat(flag_text(name, option->results()), " (the run's: ",
                                      recorded  ? flag_text(name, run)
                                      : is_flag ? "without it"
                                                : "the default " + run.front(),
                                      ")"));
      }
    } else if (recorded) {
      taken_from_checkpoint_.push_back(name);
      for (const std::string& value : run) option->add_result(value);
      try {
        option->run_callback();  // the flag's own checks, as if typed
      } catch (const CLI::Error& e) {
        throw ValueError(str_cat("--resume ", c_.resume, ": the checkpoint's ",
                                 flag_text(name, run), ": ", e.what()));
      }
    }
  }
  if (!differences.empty()) {
    std::string list;
    for (const std::string& d : differences) list += (list.empty() ? "" : "; ") + d;
    throw ValueError(str_cat("--resume ", c_.resume,
                             " continues a run with the settings it began with; this command "
                             "differs in ",
                             list, " (leave these flags out)"));
  }
}

// What a checkpoint records for take_resumed_flags(): every flag given but the command's own, and
// the device, whose default depends on the machine.
void Flags::record_run_flags() {
  c_.run_flags.clear();
  for (const CLI::Option* option : app_.get_options()) {
    const std::string name = option->get_name();
    if (option->count() > 0 && resume_rule(name) != ResumeRule::kOwn) {
      c_.run_flags[name] = option->results();
    }
  }
  c_.run_flags["--device"] = {c_.device.str()};
}

// Each text flag read once into the configuration's type; a bad one throws naming it.
void Flags::read_typed_values() {
  c_.precision = parse_precision(precision_);
  c_.loss_scale = LossScaleSetting::parse(loss_scale_);
  c_.lr_scaling = optim::parse_lr_scaling(lr_scaling_);
  c_.schedule = optim::Schedule::parse(schedule_);
  c_.pipeline_schedule = distributed::parse_pipeline_schedule(pipeline_schedule_);
  c_.accum_schedule.reset();
  if (!accum_schedule_.empty()) {
    c_.accum_schedule = optim::AccumSchedule::parse(accum_schedule_, kMaxBatch);
  }
  c_.memory_budget.reset();
  if (!memory_budget_.empty()) c_.memory_budget = parse_bytes(memory_budget_);
  c_.weight_decay.reset();
  if (!weight_decay_.empty()) c_.weight_decay = decimal_number(weight_decay_).value();
  c_.bucket_kib.reset();
  if (!bucket_kib_.empty()) c_.bucket_kib = decimal_integer(bucket_kib_).value();
  c_.zero_reduce.reset();
  if (!zero_reduce_.empty()) c_.zero_reduce = distributed::parse_zero_reduce(zero_reduce_);
  c_.zero_prefetch.reset();
  if (!zero_prefetch_.empty()) c_.zero_prefetch = distributed::parse_zero_prefetch(zero_prefetch_);
}

void Flags::check() {
  check_no_empty_values();
  take_resumed_flags();
  checking_resumed_flags([&] {
    check_no_empty_values();  // the checkpoint's values too
    check_settings();
  });
}

std::function<void()> Flags::checked(std::function<void()> more) {
  return [this, more = std::move(more)] {
    check();
    checking_resumed_flags(more);
  };
}

// A mistake in what the checkpoint recorded: the error says where the flags it names came from.
void Flags::checking_resumed_flags(const std::function<void()>& checks) const {
  try {
    checks();
  } catch (const ValueError& e) {
    std::string from;
    const std::string what = e.what();
    for (const std::string& flag : taken_from_checkpoint_) {
      const size_t at = what.find(flag);
      const bool named = at != std::string::npos &&
                         (at + flag.size() == what.size() ||
                          !(std::isalnum(static_cast<unsigned char>(what[at + flag.size()])) ||
                            what[at + flag.size()] == '-'));
      if (named) from += (from.empty() ? "" : ", ") + flag;
    }
    if (from.empty()) throw;
    throw ValueError(str_cat(what, " (", from, ": from the checkpoint in ", c_.resume, ")"));
  }
}

void Flags::check_settings() {
  read_typed_values();
  c_.device = Device::parse(device_);
  c_.cuda_graphs = cuda_graphs_ == "on"    ? CudaGraphs::kOn
                   : cuda_graphs_ == "off" ? CudaGraphs::kOff
                                           : CudaGraphs::kAuto;
  if (c_.device.is_cuda() && c_.device.index >= cuda_device_count()) {
    throw ValueError("--device " + device_ + ": no such GPU (" +
                     (cuda_unavailable_reason().empty()
                          ? "only " + std::to_string(cuda_device_count()) + " present"
                          : cuda_unavailable_reason()) +
                     ")");
  }
  c_.shuffle = !no_shuffle_;
  // The world size comes from the launcher's environment: no MPI call before the data is read.
  const distributed::LaunchInfo launch = distributed::launch_info();
  check_strategies(c_);
  train::check_pipeline(c_, launch.world_size);
  check_batches(launch.world_size / c_.pipeline);
  if (c_.cuda_graphs == CudaGraphs::kOn && !c_.device.is_cuda()) {
    throw ValueError("--cuda-graphs on needs a GPU; this run's device is " + c_.device.str());
  }
  check_each_flag_takes_effect();
  if (launch.rank == 0) check_outputs();  // rank 0 alone writes them
  check_inputs();
  record_run_flags();
}

std::vector<int64_t> parse_size_list(const std::string& flag, const std::string& text, int64_t max,
                                     const std::string& example) {
  if (text.empty()) throw ValueError(flag + ": give at least one size");
  std::vector<int64_t> sizes;
  size_t begin = 0;
  while (true) {  // every item between commas, the empty ones of "64," and ",64" included
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    const std::optional<int64_t> v = decimal_integer(item);
    if (!v || *v <= 0 || *v > max) {
      throw ValueError(str_cat(flag, ": '", item, "' in '", text, "' is not an integer in [1, ",
                               max, "] (e.g. ", example, ")"));
    }
    sizes.push_back(*v);
    if (end == text.size()) break;
    begin = end + 1;
  }
  return sizes;
}

int parse_command_line(CLI::App& app, int argc, const char* const* argv, const std::string& program,
                       std::ostream& out, std::ostream& err, const std::function<void()>& check) {
  // Each line in one write: ranks' lines stay whole. A refused command writes nothing, not even
  // ACCRUE_PROFILE's trace at exit (its path may be what was refused).
  const auto refuse = [&](const std::string& line) {
    set_profile_trace_path("");
    err << str_cat(program, ": ", printable_line(line), "\n");
    return 2;
  };
  try {
    app.parse(argc, argv);
    check();
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    return refuse(what.substr(0, what.find('\n')) + " (see --help)");
  } catch (const std::invalid_argument& e) {
    return refuse(e.what());
  } catch (const FileError& e) {
    return refuse(e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    return refuse(e.path1().string() + ": " + e.code().message());
  }
  return -1;
}

}  // namespace accrue::train
