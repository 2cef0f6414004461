// The training engine's settings: everything that turns a model and a dataset into a training
// run (device and ranks, precision, the batch and its accumulation, the learning rate and its
// schedule, the optimizer, ZeRO, offloading, checkpoints, outputs), shared by every example and
// declared once as command-line flags (flags.h), which parse each one once into its type here.
// Each default and limit is written once, below. Read next: task.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "distributed/communicator.h"
#include "distributed/pipeline.h"
#include "distributed/zero.h"
#include "kernels/op_kinds.h"
#include "optim/schedule.h"
#include "optim/window.h"

namespace accrue::train {

class Strategy;

// --cuda-graphs: capture each micro-step shape and the boundary step as CUDA graphs and replay
// them (train/step_graphs.h). auto: on a GPU, off on the CPU; on: a GPU is required.
enum class CudaGraphs { kAuto, kOn, kOff };

// fp32; fp64 (model, data and optimizer in float64); bf16 or fp16: mixed precision, with float32
// master weights, gradients and optimizer state and 16-bit activations and weights in the GEMMs
// (optim::ParameterArena::use_working_copy).
enum class Precision { kFp32, kFp64, kBf16, kFp16 };
const char* precision_name(Precision precision);  // "fp32", ...
// Throws ValueError naming the text and the choices.
Precision parse_precision(const std::string& text);

// --loss-scale: auto (dynamic for fp16, none otherwise), none, dynamic, or a fixed scale.
struct LossScaleSetting {
  enum class Kind { kAuto, kNone, kDynamic, kFixed };
  Kind kind = Kind::kAuto;
  double fixed = 1;  // kFixed's scale
  // Throws ValueError naming the text: not a kind nor a usable float32 scale.
  static LossScaleSetting parse(const std::string& text);
  std::string str() const;  // what parse() reads back
};

// The limits of the flags, each written once.
constexpr int64_t kMaxBatch = 2147483647;  // effective batch, micro-batch, k
constexpr int64_t kMaxEpochs = 1000000;
constexpr int64_t kDefaultBatch = 128;  // the effective batch when only a memory budget is given

struct Config {
  Device device = Device::cpu();
  CudaGraphs cuda_graphs = CudaGraphs::kAuto;
  Precision precision = Precision::kFp32;
  LossScaleSetting loss_scale;
  int64_t micro_batch = 0, accum_steps = 0, batch = 0;  // any two; defaults 32 x 4; 0: not given
  // k by epoch (optim::AccumSchedule, "1:1,2:4"): excludes --accum-steps and --batch (the
  // micro-batch stays, the effective batch moves with k).
  std::optional<optim::AccumSchedule> accum_schedule;
  // Device bytes (budget.h, "64MiB"): the micro-batch is the largest that fits, measured by probe
  // micro-steps; k follows from --batch (default kDefaultBatch). Excludes --micro-batch,
  // --accum-steps, --accum-schedule.
  std::optional<int64_t> memory_budget;
  int64_t epochs = 5;
  int64_t max_steps = 0;    // 0: no limit
  int64_t train_limit = 0;  // 0: all samples; else the first N of the training set
  double lr = 1e-3;
  optim::LrScaling lr_scaling = optim::LrScaling::kNone;
  int64_t base_batch = 128;  // the batch lr was tuned for, for --lr-scaling
  optim::ScheduleKind schedule = optim::ScheduleKind::kConstant;
  int64_t warmup = 0;
  double clip = 1.0;
  std::string optimizer = "adam";      // a registered name (optim/registry.h)
  std::optional<double> weight_decay;  // unset: the optimizer's default
  double momentum = 0.9;               // sgd
  uint64_t seed = 0;
  bool shuffle = true;
  // The ZeRO stage over the data-parallel ranks: 1 shards the optimizer state, 2 the gradients
  // too (distributed/zero.h), 3 the parameters too (distributed/zero3.h).
  int zero = 0;
  // When ZeRO-2 reduce-scatters the gradient (--zero-reduce; only with zero = 2); unset:
  // kBoundary (docs/zero.md says why).
  std::optional<distributed::ZeroReduce> zero_reduce;
  // Which of ZeRO-3's gathers start a layer ahead (--zero-prefetch; only with zero = 3); unset:
  // kForward (docs/zero.md says why).
  std::optional<distributed::ZeroPrefetch> zero_prefetch;
  // > 1: the model's layers (Task::layers) cut into this many stages on as many ranks, the
  // window's micro-batches scheduled through them (distributed/pipeline.h); the ranks are
  // data-parallel groups of `pipeline` consecutive ranks. Needs k >= pipeline.
  int pipeline = 1;
  distributed::PipelineSchedule pipeline_schedule = distributed::PipelineSchedule::kOneFOneB;
  // > 0: overlap the boundary's all-reduce (several ranks) or copy to the host (offloaded, one
  // rank) with the last backward, in buckets of this size; 0: at the boundary; unset: the
  // strategies' default (0, or 1024 for an offloaded optimizer on one rank).
  std::optional<int64_t> bucket_kib;
  // The float masters and the optimizer state in pinned host memory, the step on the CPU
  // (optim/offload.h).
  bool offload_optimizer = false;
  int threads = 0;  // 0: tuned while training (core/threads.h)
  std::string metrics, save, init;
  std::string save_init;  // the weights the first step starts from, for peers and studies
  // checkpoint.h: write the training state into this folder every checkpoint_every optimizer
  // steps and at the end; continue from the newest checkpoint in `resume`.
  std::string checkpoint, resume;
  int64_t checkpoint_every = 500;
  // Evaluation during training: every eval_every optimizer steps (0: at each epoch's end only)
  // the task's held-out measure (Task::validate) is taken and recorded. keep_best: the weights of
  // the best held-out evaluation so far go to <checkpoint>/best.safetensors (needs checkpoint);
  // early_stop > 0: the run ends after that many evaluations without improvement (needs
  // eval_every).
  int64_t eval_every = 0;
  bool keep_best = false;
  int64_t early_stop = 0;
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
  // The flags a checkpoint records for --resume DIR to take (every one given but the command's
  // own, see ResumeRule) and the device: Flags::check fills it. Empty: the run was configured in
  // code, and a resume matches the resolved configuration alone.
  std::map<std::string, std::vector<std::string>> run_flags;
};

// What --resume DIR does with a flag, listed in one place (config.cpp):
// - kOwn: the resumed command's own, never recorded: the outputs (--save, --metrics, --save-init,
//   --checkpoint, --checkpoint-every, --quiet, --profile), --threads, --comm-timeout.
// - kCarried: taken from the checkpoint unless given, and may be given another value: --data (the
//   same data elsewhere: the engine checks its hash), the run's length (--epochs, --max-steps:
//   the engine refuses a length that moves a cosine schedule's horizon), the evaluation's cadence
//   and the best weights (--eval-every, --keep-best, --early-stop, g2p's --eval).
// - kShapes, every other flag (the model and the example's, --train-limit, the batch, the recipe,
//   precision, ZeRO, the pipeline, buckets, the device): taken from the checkpoint; a value given
//   that differs is refused.
enum class ResumeRule { kShapes, kCarried, kOwn };
ResumeRule resume_rule(const std::string& flag);

// --pipeline P: the ranks must split into groups of P; throws ValueError naming the flag.
// world_size: every rank of the job. (What the stages combine with: strategies.h.)
void check_pipeline(const Config& config, int world_size);

// --pipeline P needs at least P micro-batches in each window; `k` says which (the flag, the epoch).
void check_pipeline_depth(int pipeline, int64_t k, const std::string& which_k);
// --memory-budget fixes the effective batch first: it must split over the data-parallel ranks.
void check_batch_splits(int64_t batch, int64_t ranks);

// The dtype of the activations and of the weights the GEMMs read, and of the master weights,
// the gradients and the optimizer state.
DType compute_dtype(Precision precision);
DType master_dtype(Precision precision);

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

// What --loss-scale comes to for a precision: off, or on from `initial` (2^16, GradScaler's
// default, when dynamic) with the scaling's settings (kernels/functors.h LossScaling).
struct LossScalePlan {
  bool on = false;
  LossScaling scaling;  // scaling.dynamic: moved once per window
  double initial = 1;
};
LossScalePlan resolve_loss_scale(const LossScaleSetting& loss_scale, Precision precision);

// The learning rate of an effective batch: --lr moved from --base-batch by --lr-scaling. The one
// place a run's rate is computed.
double run_lr(const Config& config, int64_t batch);

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
