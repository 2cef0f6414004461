// Command-line parsing of accrue-mnist with CLI11: every flag with its default in --help; a
// mistake prints one line and exits with status 2.
#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <limits>
#include <ostream>
#include <sstream>

#include "budget.h"
#include "core/error.h"
#include "core/file.h"
#include "optim/schedule.h"
#include "optim/window.h"
#include "trainer.h"

namespace accrue::mnist {

namespace {

// Upper limits of the integer flags: sample positions are int32, and products of these stay far
// inside int64 (steps per epoch x epochs, batch x hidden width).
constexpr int64_t kMaxBatch = INT32_MAX;
constexpr int64_t kMaxEpochs = 1000000;
constexpr int64_t kMaxWidth = 1 << 20;

std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v <= 0 || v > kMaxWidth) {
      throw ValueError(str_cat("--hidden: '", item, "' in '", text, "' is not an integer in [1, ",
                               kMaxWidth, "] (e.g. 512,256,128)"));
    }
    sizes.push_back(v);
  }
  if (text.empty()) throw ValueError("--hidden: give at least one layer size");
  return sizes;
}

}  // namespace

namespace {

// One line for a --batch that the world and the fixed size do not divide: the nearest valid
// effective batches below and above, with the k (or micro-batch) and the learning rate of each.
[[noreturn]] void throw_not_divisible(const Config& c, const optim::BatchConfig& b) {
  const bool k_derived = b.accum_steps == 0;
  const int64_t fixed = k_derived ? b.micro_batch : b.accum_steps;
  const int64_t unit = fixed * b.world_size;  // both checked to be small before
  const auto option = [&](int64_t batch) {
    const double lr =
        optim::scale_lr(c.lr, batch, c.base_batch, optim::parse_lr_scaling(c.lr_scaling));
    return str_cat(batch, " (", k_derived ? "k = " : "micro-batch ", batch / unit, ", lr ", lr,
                   ")");
  };
  const int64_t below = b.batch / unit * unit, above = below + unit;
  throw ValueError(str_cat(
      "--batch ", b.batch, " is not a multiple of ", b.world_size, " rank",
      b.world_size == 1 ? "" : "s", " x ", k_derived ? "micro-batch " : "accumulation steps ",
      fixed, " = ", unit,
      "; nearest valid effective batches: ", below > 0 ? option(below) + " and " : std::string(),
      option(above), " with --lr-scaling ", c.lr_scaling));
}

}  // namespace

optim::ResolvedBatch resolve_config_batch(const Config& c, int64_t world_size) {
  if (c.micro_batch < 0 || c.accum_steps < 0 || c.batch < 0) {
    throw ValueError(str_cat("--micro-batch, --accum-steps and --batch must be positive, got ",
                             c.micro_batch, ", ", c.accum_steps, ", ", c.batch));
  }
  // Fewer than two given: the default recipe's 32 x 4 fills in, micro-batch first.
  optim::BatchConfig b{c.batch, c.micro_batch, c.accum_steps, world_size};
  const int given = (b.batch > 0) + (b.micro_batch > 0) + (b.accum_steps > 0);
  if (given < 2 && b.micro_batch == 0) b.micro_batch = 32;
  if (given == 0 || (given == 1 && b.batch == 0 && b.accum_steps == 0)) b.accum_steps = 4;
  const int64_t fixed = b.accum_steps == 0 ? b.micro_batch : b.accum_steps;
  if (b.batch > 0 && (b.micro_batch == 0) != (b.accum_steps == 0) && fixed <= kMaxBatch &&
      world_size <= kMaxBatch && b.batch % (fixed * world_size) != 0) {
    throw_not_divisible(c, b);
  }
  const optim::ResolvedBatch r = optim::resolve_batch(b);
  if (r.batch > kMaxBatch) {
    throw ValueError(str_cat("--batch: ", r.str(), " exceeds ", kMaxBatch,
                             " samples (sample positions are int32)"));
  }
  return r;
}

namespace {

// Which ends of a finite_in interval are excluded.
enum class Open { kNeither, kLow, kHigh };

// A CLI11 check: a finite number in [low, high], with one end excluded when `open` says so. The
// message is one short line naming the value (never DBL_MAX in 309 digits).
CLI::Validator finite_in(double low, double high, Open open = Open::kNeither) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not a number";
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

// A CLI11 check: an integer in [low, high].
CLI::Validator int_in(int64_t low, int64_t high) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(text, v) || v < low || v > high) {
          return str_cat("'", text, "' is not an integer in [", low, ", ", high, "]");
        }
        return "";
      },
      "");
}

constexpr double kHuge = std::numeric_limits<double>::max();

}  // namespace

int parse_args(int argc, const char* const* argv, Config& c, std::ostream& out, std::ostream& err) {
  CLI::App app{"accrue-mnist: train an MLP on MNIST with gradient accumulation"};
  app.option_defaults()->always_capture_default();
  std::string device = cuda_device_count() > 0 ? "cuda" : "cpu";
  std::string hidden = "512,256,128";
  bool no_shuffle = false;
  app.add_option("--data", c.data, "Folder with the four MNIST IDX files");
  app.add_option("--device", device, "cpu or cuda[:N] (default: cuda when present)");
  app.add_option("--precision", c.precision,
                 "fp32; fp64 (everything in float64, for exactness studies); bf16 or fp16 (mixed: "
                 "16-bit activations, float32 master weights, gradients and optimizer state)")
      ->check(CLI::IsMember({"fp32", "fp64", "bf16", "fp16"}));
  app.add_option("--loss-scale", c.loss_scale,
                 "auto (dynamic for fp16, none otherwise), none, dynamic, or a fixed scale");
  app.add_option("--model", c.model, "mlp, or cnn (conv-pool x 2, fc 128, fc 10)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--norm", c.norm, "The CNN's normalisation: none, batch, group or layer")
      ->check(CLI::IsMember({"none", "batch", "group", "layer"}));
  app.add_option("--hidden", hidden, "The MLP's hidden layer sizes, comma-separated");
  app.add_option("--micro-batch", c.micro_batch, "Samples per micro-step b (default 32)")
      ->check(int_in(0, kMaxBatch));
  app.add_option("--accum-steps", c.accum_steps, "Micro-steps per optimizer step k (default 4)")
      ->check(int_in(0, kMaxBatch));
  app.add_option("--accum-schedule", c.accum_schedule,
                 "k by epoch, e.g. 1:1,2:2,3:4,5:8 (the effective batch follows; excludes "
                 "--accum-steps and --batch)");
  app.add_option("--memory-budget", c.memory_budget,
                 "Device bytes a run may use (e.g. 64MiB, 1GiB): the largest micro-batch that "
                 "fits is measured and chosen; k follows from --batch");
  app.add_option("--batch", c.batch, "Effective batch B = b * k (give any two of the three)")
      ->check(int_in(0, kMaxBatch));
  app.add_option("--epochs", c.epochs, "Passes over the training set")
      ->check(int_in(1, kMaxEpochs));
  app.add_option("--max-steps", c.max_steps, "Stop after this many optimizer steps (0: no limit)")
      ->check(int_in(0, INT64_MAX));
  app.add_option("--train-limit", c.train_limit, "Use the first N training samples (0: all)")
      ->check(int_in(0, INT32_MAX));
  app.add_option("--lr", c.lr, "Learning rate at --base-batch")
      ->check(finite_in(0, kHuge, Open::kLow));
  app.add_option("--lr-scaling", c.lr_scaling, "Scale lr with the batch: none, linear, sqrt")
      ->check(CLI::IsMember({"none", "linear", "sqrt"}));
  app.add_option("--base-batch", c.base_batch, "Batch size --lr was tuned for")
      ->check(int_in(1, kMaxBatch));
  app.add_option("--schedule", c.schedule, "LR schedule: constant, warmup, cosine")
      ->check(CLI::IsMember({"constant", "warmup", "cosine"}));
  app.add_option("--warmup", c.warmup, "Linear warmup steps")->check(int_in(0, INT32_MAX));
  app.add_option("--clip", c.clip, "Clip the gradient norm to this (0: off)")
      ->check(finite_in(0, kHuge));
  app.add_option("--optimizer", c.optimizer, "adam, adamw or sgd")
      ->check(CLI::IsMember({"adam", "adamw", "sgd"}));
  app.add_option("--weight-decay", c.weight_decay,
                 "Weight decay (default: 0 for adam and sgd, 0.01 for adamw)")
      ->check(finite_in(0, kHuge));
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(finite_in(0, 1, Open::kHigh));
  app.add_option("--seed", c.seed, "Seed for initialisation and shuffling");
  app.add_flag("--no-shuffle", no_shuffle, "Keep the file order of the samples");
  app.add_option("--threads", c.threads,
                 "CPU threads (0: tuned while training among 1, 2, 4, ..., every core)")
      ->check(int_in(0, 4096));
  app.add_option("--zero", c.zero,
                 "1: shard the optimizer state over the data-parallel ranks (ZeRO stage 1)")
      ->check(int_in(0, 1));
  app.add_option("--bucket-kib", c.bucket_kib,
                 "Overlap the boundary's transfer (the all-reduce with several ranks, the copy to "
                 "the host with --offload-optimizer) with the last backward, in buckets of this "
                 "many KiB (0: all at the boundary; default 0, or 1024 with --offload-optimizer "
                 "on one rank)")
      ->check(int_in(0, 1 << 20));
  app.add_flag("--offload-optimizer", c.offload_optimizer,
               "Keep the float master weights and the optimizer state in pinned host memory and "
               "run the optimizer step on the CPU (ZeRO-Offload)");
  app.add_option("--metrics", c.metrics, "Write JSON Lines metrics to this file");
  app.add_option("--save", c.save, "Save the final weights (safetensors)");
  app.add_option("--init", c.init, "Start from these weights (safetensors)");
  app.add_option("--checkpoint", c.checkpoint,
                 "Write the whole training state into this folder (the newest two are kept)");
  app.add_option("--checkpoint-every", c.checkpoint_every,
                 "Optimizer steps between checkpoints (and one at the end)")
      ->check(int_in(1, INT64_MAX));
  app.add_option("--resume", c.resume,
                 "Continue from the newest checkpoint in this folder, bit for bit");
  app.add_flag("--quiet", c.quiet, "No progress output");
  try {
    app.parse(argc, argv);
    c.device = Device::parse(device);
    if (c.device.is_cuda() && c.device.index >= cuda_device_count()) {
      throw ValueError("--device " + device + ": no such GPU (" +
                       (cuda_unavailable_reason().empty()
                            ? "only " + std::to_string(cuda_device_count()) + " present"
                            : cuda_unavailable_reason()) +
                       ")");
    }
    c.hidden = parse_sizes(hidden);
    resolve_loss_scale(c.loss_scale, c.precision);
    if (c.model != "cnn" && c.norm != "none") {
      throw ValueError("--norm " + c.norm + " applies to --model cnn");
    }
    if (c.model == "cnn" && c.precision != "fp32" && c.precision != "fp64") {
      throw ValueError(
          "--model cnn runs in fp32 or fp64 (its convolution and normalisation "
          "kernels have no 16-bit versions), got --precision " +
          c.precision);
    }
    c.shuffle = !no_shuffle;
    // The world size comes from the launcher's environment: no MPI call before the data is read.
    const distributed::LaunchInfo launch = distributed::launch_info();
    // Every k the run will use: one, or each of --accum-schedule's; with --memory-budget the
    // micro-batch is measured later, and only the effective batch is known here.
    std::vector<Config> variants{c};
    if (!c.memory_budget.empty()) {
      parse_bytes(c.memory_budget);
      if (c.micro_batch > 0 || c.accum_steps > 0 || !c.accum_schedule.empty()) {
        throw ValueError(
            "--memory-budget chooses the micro-batch; it excludes --micro-batch, --accum-steps "
            "and --accum-schedule");
      }
      variants.front().micro_batch = 1;  // any divisor: the batch and lr checks below
      if (variants.front().batch == 0) variants.front().batch = 128;
    }
    if (!c.accum_schedule.empty()) {
      if (c.accum_steps > 0 || c.batch > 0) {
        throw ValueError("--accum-schedule sets k by epoch; it excludes --accum-steps and --batch");
      }
      variants.clear();
      for (const auto& [epoch, k] :
           optim::AccumSchedule::parse(c.accum_schedule, kMaxBatch).points) {
        Config v = c;
        v.accum_steps = k;
        variants.push_back(v);
      }
    }
    for (const Config& v : variants) {
      const optim::ResolvedBatch batch = resolve_config_batch(v, launch.world_size);
      const double lr =
          optim::scale_lr(c.lr, batch.batch, c.base_batch, optim::parse_lr_scaling(c.lr_scaling));
      if (!std::isfinite(lr) || !(lr > 0)) {
        throw ValueError(str_cat("--lr ", c.lr, " scaled (", c.lr_scaling, ") from --base-batch ",
                                 c.base_batch, " to batch ", batch.batch, " gives ", lr,
                                 ", not a usable learning rate"));
      }
    }
    if (c.zero == 1 && c.bucket_kib > 0) {
      throw ValueError(
          "--zero 1 reduce-scatters the gradient at the boundary; it does not "
          "combine with --bucket-kib (overlapped all-reduce)");
    }
    if (c.offload_optimizer && c.zero == 1) {
      throw ValueError(
          "--offload-optimizer keeps the whole optimizer state on the host; it does not combine "
          "with --zero 1 (sharded optimizer state) yet");
    }
    if (launch.rank == 0) {  // rank 0 alone writes them
      if (!c.metrics.empty()) check_writable(c.metrics, "--metrics");
      if (!c.save.empty()) check_writable(c.save, "--save");
    }
    if (!c.resume.empty() && !std::filesystem::is_directory(c.resume)) {
      throw ValueError("--resume " + c.resume + ": no such folder");
    }
    if (!c.resume.empty() && !c.init.empty()) {
      throw ValueError("--resume continues a run; it excludes --init");
    }
    if (!c.init.empty() && !std::filesystem::is_regular_file(c.init)) {
      throw ValueError("--init " + c.init + ": no such file");
    }
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    err << "accrue-mnist: " << what << " (see --help)\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    err << "accrue-mnist: " << e.what() << "\n";
    return 2;
  } catch (const FileError& e) {
    err << "accrue-mnist: " << e.what() << "\n";
    return 2;
  }
  return -1;
}

}  // namespace accrue::mnist
