// The MNIST trainer behind `accrue-mnist` (the MLP, or the CNN of nn/cnn.h): configuration,
// command-line parsing and the training loop, kept out of main() so the tests can drive them. The
// loop is the canonical accrue recipe: plan windows over a shuffled epoch, run each window's
// micro-steps through optim::Accumulator, evaluate between epochs under NoGradGuard.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/device.h"
#include "distributed/communicator.h"
#include "optim/offload.h"
#include "optim/window.h"

namespace accrue::mnist {

struct Config {
  std::string data = "data/mnist";
  Device device = Device::cpu();
  // fp32; fp64 (model, data and optimizer in float64); bf16 or fp16: mixed precision, with
  // float32 master weights, gradients and optimizer state and 16-bit activations and weights
  // in the GEMMs (optim::ParameterArena::use_working_copy).
  std::string precision = "fp32";
  // auto (dynamic for fp16, none otherwise), none, dynamic, or a fixed scale.
  std::string loss_scale = "auto";
  std::string model = "mlp";                   // or "cnn" (nn/cnn.h)
  std::string norm = "none";                   // the CNN's normalisation: none, batch, group, layer
  std::vector<int64_t> hidden{512, 256, 128};  // the MLP's hidden layers
  int64_t micro_batch = 0, accum_steps = 0, batch = 0;  // any two; defaults 32 x 4
  // "epoch:k,..." (optim::AccumSchedule): k follows the epoch; excludes --accum-steps and
  // --batch (the micro-batch stays, the effective batch moves with k).
  std::string accum_schedule;
  // "64MiB" (budget.h): the micro-batch is the largest that fits, measured by probe micro-steps;
  // k follows from --batch (default 128). Excludes --micro-batch, --accum-steps, --accum-schedule.
  std::string memory_budget;
  int64_t epochs = 5;
  int64_t max_steps = 0;    // 0: no limit
  int64_t train_limit = 0;  // 0: all samples
  double lr = 1e-3;
  std::string lr_scaling = "none";
  int64_t base_batch = 128;  // the batch lr was tuned for, for --lr-scaling
  std::string schedule = "constant";
  int64_t warmup = 0;
  double clip = 1.0;
  std::string optimizer = "adam";
  double weight_decay = -1;  // < 0: the optimizer's default
  double momentum = 0.9;     // sgd
  uint64_t seed = 0;
  bool shuffle = true;
  int zero = 0;  // 1: shard the optimizer state over the ranks (ZeRO stage 1)
  // > 0: overlap the boundary's all-reduce (several ranks) or copy to the host (offloaded, one
  // rank) with the last backward, in buckets of this size; 0: at the boundary; < 0: 0, or 1024
  // for an offloaded optimizer on one rank.
  int64_t bucket_kib = -1;
  // The float masters and the optimizer state in pinned host memory, the step on the CPU
  // (optim/offload.h); excludes zero = 1.
  bool offload_optimizer = false;
  int threads = 0;  // 0: tuned while training (core/threads.h)
  std::string metrics, save, init;
  // resume.h: write the training state into this folder every checkpoint_every optimizer steps
  // and at the end; continue from the newest checkpoint in `resume`.
  std::string checkpoint, resume;
  int64_t checkpoint_every = 500;
  bool quiet = false;  // no progress output (tests)
  // The data-parallel ranks; null: distributed::world_for(device), from the launcher's environment.
  distributed::Communicator* comm = nullptr;
};

struct Summary {
  double test_accuracy = 0;
  double train_seconds = 0;
  double samples_per_second = 0;
  int64_t steps = 0;                 // optimizer steps taken
  int64_t skipped_steps = 0;         // of which skipped (non-finite gradient): no update
  double final_loss_scale = 1;       // after the last step (1 without loss scaling)
  size_t peak_activation_bytes = 0;  // of a micro-step, above the baseline
  std::vector<double> step_loss_scales;
  std::vector<int64_t> step_batches;       // the effective batch of every step (its window's size)
  int64_t micro_batch = 0;                 // used (chosen by --memory-budget, or given)
  size_t peak_bytes = 0;                   // live bytes at the highest point of any micro-step
  double activation_bytes_per_sample = 0;  // --memory-budget's probes
  double activation_fixed_bytes = 0;
  size_t memory_baseline_bytes = 0;
  std::vector<double> step_losses;
  std::vector<double> step_grad_norms;
  int64_t buckets_overlapped = 0;  // all-reduce buckets started during backward (--bucket-kib)
  int64_t buckets_at_step = 0;     // and at the boundary
  uint64_t parameter_hash = 0;     // FNV-1a of the final parameters' bytes: equal on every rank
  // Measured with the allocators' statistics once the model, arena and optimizer are built:
  // bytes they hold on the compute device, and in pinned host memory (the offloaded optimizer).
  size_t device_state_bytes = 0;
  size_t host_state_bytes = 0;
  optim::OffloadTraffic offload;  // bytes moved by the offloaded optimizer (zeros otherwise)
};

// The batch arithmetic of a config: any two of --batch, --micro-batch, --accum-steps; with
// fewer, the default recipe's micro-batch 32 and then 4 accumulation steps fill in.
// world_size: the data-parallel ranks; a --batch they and the fixed size do not divide is an
// error naming the nearest valid effective batches and the learning rate of each.
optim::ResolvedBatch resolve_config_batch(const Config& config, int64_t world_size = 1);
// What --loss-scale resolves to for a precision: off, fixed at `initial`, or dynamic from
// `initial` (2^16, GradScaler's default). Throws ValueError for a bad value.
struct LossScaleChoice {
  bool on = false, dynamic = false;
  double initial = 1;
};
LossScaleChoice resolve_loss_scale(const std::string& loss_scale, const std::string& precision);
// Parses argv into config. Returns -1 to go on, else the exit status main() should return
// (0 after --help, 2 after a mistake, with one line on err saying what is wrong).
int parse_args(int argc, const char* const* argv, Config& config, std::ostream& out,
               std::ostream& err);
// Trains and evaluates; prints progress and the summary to out. Metrics (--metrics) are written
// to a temporary beside the file and renamed over it when training ends.
Summary train(const Config& config, std::ostream& out);
// parse_args + train, with errors turned into messages and exit statuses: 2 for a bad command
// line (before any data is read), 1 for bad data or a failure, 1 when every step was skipped.
int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace accrue::mnist
