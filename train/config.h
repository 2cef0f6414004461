// The training engine's settings: everything that turns a model and a dataset into a training
// run (device and ranks, precision, the batch and its accumulation, the learning rate and its
// schedule, the optimizer, ZeRO, offloading, checkpoints, outputs), shared by every example and
// declared once as command-line flags (flags.h). Read next: task.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "distributed/communicator.h"
#include "optim/window.h"

namespace accrue::train {

class Strategy;

// --cuda-graphs: capture each micro-step shape and the boundary step as CUDA graphs and replay
// them (train/step_graphs.h). auto: on a GPU, off on the CPU; on: a GPU is required.
enum class CudaGraphs { kAuto, kOn, kOff };

struct Config {
  Device device = Device::cpu();
  CudaGraphs cuda_graphs = CudaGraphs::kAuto;
  // fp32; fp64 (model, data and optimizer in float64); bf16 or fp16: mixed precision, with
  // float32 master weights, gradients and optimizer state and 16-bit activations and weights
  // in the GEMMs (optim::ParameterArena::use_working_copy).
  std::string precision = "fp32";
  // auto (dynamic for fp16, none otherwise), none, dynamic, or a fixed scale.
  std::string loss_scale = "auto";
  int64_t micro_batch = 0, accum_steps = 0, batch = 0;  // any two; defaults 32 x 4
  // "epoch:k,..." (optim::AccumSchedule): k follows the epoch; excludes --accum-steps and
  // --batch (the micro-batch stays, the effective batch moves with k).
  std::string accum_schedule;
  // "64MiB" (budget.h): the micro-batch is the largest that fits, measured by probe micro-steps;
  // k follows from --batch (default 128). Excludes --micro-batch, --accum-steps, --accum-schedule.
  std::string memory_budget;
  int64_t epochs = 5;
  int64_t max_steps = 0;    // 0: no limit
  int64_t train_limit = 0;  // 0: all samples; else the first N of the training set
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
  // > 1: the model's layers (Task::layers) cut into this many stages on as many ranks, the
  // window's micro-batches scheduled through them (distributed/pipeline.h); the ranks are
  // data-parallel groups of `pipeline` consecutive ranks. Needs k >= pipeline.
  int pipeline = 1;
  std::string pipeline_schedule = "1f1b";  // or "gpipe"
  // > 0: overlap the boundary's all-reduce (several ranks) or copy to the host (offloaded, one
  // rank) with the last backward, in buckets of this size; 0: at the boundary; < 0: 0, or 1024
  // for an offloaded optimizer on one rank.
  int64_t bucket_kib = -1;
  // The float masters and the optimizer state in pinned host memory, the step on the CPU
  // (optim/offload.h); excludes zero = 1.
  bool offload_optimizer = false;
  int threads = 0;  // 0: tuned while training (core/threads.h)
  std::string metrics, save, init;
  std::string save_init;  // the weights the first step starts from, for peers and studies
  // checkpoint.h: write the training state into this folder every checkpoint_every optimizer
  // steps and at the end; continue from the newest checkpoint in `resume`.
  std::string checkpoint, resume;
  int64_t checkpoint_every = 500;
  bool quiet = false;    // no progress output (tests)
  bool profile = false;  // kernels/profile.h's tables at exit, as ACCRUE_PROFILE=1
  // The watchdog (distributed/communicator.h): seconds a wait for the other ranks may take
  // before the job is aborted; <= 0: no limit.
  double comm_timeout = 600;
  // The data-parallel ranks; null: distributed::world_for(device), from the launcher's
  // environment.
  distributed::Communicator* comm = nullptr;
  // Strategies of the caller's own (strategy.h), composed after the built-in ones.
  std::vector<std::shared_ptr<Strategy>> strategies;
};

// --pipeline P: the ranks must split into groups of P; throws ValueError naming the flag.
// world_size: every rank of the job. (What the stages combine with: strategies.h.)
void check_pipeline(const Config& config, int world_size);

// The dtype of the activations and of the weights the GEMMs read, and of the master weights,
// the gradients and the optimizer state, for a --precision value.
DType compute_dtype(const std::string& precision);
DType master_dtype(const std::string& precision);

// text as a whole decimal integer (an optional minus, then digits: no '+', hex, octal or
// spaces), or nothing when it is not one or does not fit in int64.
std::optional<int64_t> decimal_integer(const std::string& text);

// The length of the longest prefix of text that is a number in plain decimal notation: digits
// with an optional fraction and exponent, an optional minus ("1", "-0.5", ".5", "3e-4", "1E+9");
// never hex ("0x10", "0x1p-4"), a '+' sign, spaces, "inf" or "nan". 0 when none.
size_t decimal_prefix(const std::string& text);
// text as a number when all of it is one in plain decimal notation, and not a non-zero value
// that a double would round to 0.
std::optional<double> decimal_number(const std::string& text);

// What --loss-scale resolves to for a precision: off, fixed at `initial`, or dynamic from
// `initial` (2^16, GradScaler's default). Throws ValueError for a bad value.
struct LossScaleChoice {
  bool on = false, dynamic = false;
  double initial = 1;
};
LossScaleChoice resolve_loss_scale(const std::string& loss_scale, const std::string& precision);

// Before any data is read: throws ValueError naming `what` (the flag that sized the model) when
// the training state of `parameters` parameters -- master weights, gradients, the optimizer's
// moments and a 16-bit working copy, as the precision and optimizer need -- exceeds this
// machine's physical memory.
void check_model_fits(const std::string& what, int64_t parameters, const Config& config);

// The batch arithmetic of a config: any two of --batch, --micro-batch, --accum-steps; with
// fewer, the default recipe's micro-batch 32 and then 4 accumulation steps fill in.
// world_size: the data-parallel ranks; a --batch they and the fixed size do not divide is an
// error naming the nearest valid effective batches and the learning rate of each.
optim::ResolvedBatch resolve_config_batch(const Config& config, int64_t world_size = 1);

}  // namespace accrue::train
