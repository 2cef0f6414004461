// Command-line parsing of accrue-mnist with CLI11: every flag with its default in --help; a
// mistake prints one line and exits with status 2.
#include <CLI/CLI.hpp>
#include <ostream>
#include <sstream>

#include "core/error.h"
#include "optim/schedule.h"
#include "optim/window.h"
#include "trainer.h"

namespace accrue::mnist {

namespace {

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
    if (used != item.size() || v <= 0) {
      throw ValueError("--hidden: '" + item + "' in '" + text +
                       "' is not a positive integer (expected e.g. 512,256,128)");
    }
    sizes.push_back(v);
  }
  if (text.empty()) throw ValueError("--hidden: give at least one layer size");
  return sizes;
}

}  // namespace

optim::ResolvedBatch resolve_config_batch(const Config& c) {
  if (c.micro_batch < 0 || c.accum_steps < 0 || c.batch < 0) {
    throw ValueError("--micro-batch, --accum-steps and --batch must be positive");
  }
  // Fewer than two given: the default recipe's 32 x 4 fills in, micro-batch first.
  optim::BatchConfig b{c.batch, c.micro_batch, c.accum_steps, 1};
  const int given = (b.batch > 0) + (b.micro_batch > 0) + (b.accum_steps > 0);
  if (given < 2 && b.micro_batch == 0) b.micro_batch = 32;
  if (given == 0 || (given == 1 && b.batch == 0 && b.accum_steps == 0)) b.accum_steps = 4;
  return optim::resolve_batch(b);
}

int parse_args(int argc, const char* const* argv, Config& c, std::ostream& out, std::ostream& err) {
  CLI::App app{"accrue-mnist: train an MLP on MNIST with gradient accumulation"};
  app.option_defaults()->always_capture_default();
  std::string device = cuda_device_count() > 0 ? "cuda" : "cpu";
  std::string hidden = "512,256,128";
  bool no_shuffle = false;
  app.add_option("--data", c.data, "Folder with the four MNIST IDX files");
  app.add_option("--device", device, "cpu or cuda[:N] (default: cuda when present)");
  app.add_option("--hidden", hidden, "Hidden layer sizes, comma-separated");
  app.add_option("--micro-batch", c.micro_batch, "Samples per micro-step b (default 32)");
  app.add_option("--accum-steps", c.accum_steps, "Micro-steps per optimizer step k (default 4)");
  app.add_option("--batch", c.batch, "Effective batch B = b * k (give any two of the three)");
  app.add_option("--epochs", c.epochs, "Passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--max-steps", c.max_steps, "Stop after this many optimizer steps (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--train-limit", c.train_limit, "Use the first N training samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", c.lr, "Learning rate at --base-batch")->check(CLI::NonNegativeNumber);
  app.add_option("--lr-scaling", c.lr_scaling, "Scale lr with the batch: none, linear, sqrt")
      ->check(CLI::IsMember({"none", "linear", "sqrt"}));
  app.add_option("--base-batch", c.base_batch, "Batch size --lr was tuned for")
      ->check(CLI::PositiveNumber);
  app.add_option("--schedule", c.schedule, "LR schedule: constant, warmup, cosine")
      ->check(CLI::IsMember({"constant", "warmup", "cosine"}));
  app.add_option("--warmup", c.warmup, "Linear warmup steps")->check(CLI::NonNegativeNumber);
  app.add_option("--clip", c.clip, "Clip the gradient norm to this (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--optimizer", c.optimizer, "adam, adamw or sgd")
      ->check(CLI::IsMember({"adam", "adamw", "sgd"}));
  app.add_option("--weight-decay", c.weight_decay,
                 "Weight decay (default: 0 for adam and sgd, 0.01 for adamw)");
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", c.seed, "Seed for initialisation and shuffling");
  app.add_flag("--no-shuffle", no_shuffle, "Keep the file order of the samples");
  app.add_option("--threads", c.threads, "CPU threads (0: every core)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics", c.metrics, "Write JSON Lines metrics to this file");
  app.add_option("--save", c.save, "Save the final weights (safetensors)");
  app.add_option("--init", c.init, "Start from these weights (safetensors)");
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
    c.shuffle = !no_shuffle;
    resolve_config_batch(c);
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
  }
  return -1;
}

}  // namespace accrue::mnist
