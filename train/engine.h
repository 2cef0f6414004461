// The training engine: turns a Task (task.h) and a Config (config.h) into a training run. It owns
// the launcher's ranks and the device of each, the CPU threads, the precision policy, the window
// plan of every epoch (the k schedule, the memory budget's micro-batch), the learning rate's
// scaling and schedule, the optimizer and the pieces around it (ZeRO-1, the gradient all-reduce,
// the offloaded optimizer), checkpoints and bitwise resume, progress, JSON Lines metrics, the
// summary and saving. Per-step, per-epoch and per-checkpoint records reach the caller through
// Callbacks. A micro-step is the recipe of the whole library:
//   index = order[micro-batch]; samples = task.samples(index); loss = task.loss(model, samples)
//   -> optim::Accumulator (backward seeded with 1 / items of the window) -> boundary step.
// Read next: strategy.h (how a run spreads over ranks), engine.cpp, then run.h for exit
// statuses, then examples/mnist/mnist.h.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "core/host_waits.h"
#include "optim/offload.h"
#include "train/config.h"
#include "train/step_graphs.h"
#include "train/strategy.h"
#include "train/task.h"

namespace accrue::train {

struct StepEvent {
  int64_t step = 0;     // 1-based optimizer step
  int64_t epoch = 0;    // 1-based
  int64_t samples = 0;  // in the window, over every rank
  int64_t items = 0;    // loss items in the window (the normaliser)
  int64_t tokens = 0;   // non-padding tokens in the window (Task::length), 0 without
  double loss = 0;      // mean over the window's items
  double grad_norm = 0;
  double lr = 0;
  bool skipped = false;
  double loss_scale = 1;
  int64_t accum_steps = 0, batch = 0;  // the window's k and effective batch
};

struct EpochEvent {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0;
  Evaluation evaluation;
  double seconds = 0;
};

struct CheckpointEvent {
  int64_t step = 0;
  std::string dir;
};

struct Callbacks {
  std::function<void(const StepEvent&)> on_step;
  std::function<void(const EpochEvent&)> on_epoch;
  std::function<void(const CheckpointEvent&)> on_checkpoint;
};

// --pipeline: what one stage did over the run (rank 0's pipeline group).
struct StageSummary {
  int stage = 0;
  int max_in_flight = 0;             // micro-batches with activations held at once
  size_t peak_activation_bytes = 0;  // above the window's start
  double busy_seconds = 0;           // computing
  double wait_seconds = 0;           // waiting for a neighbouring stage
  double seconds = 0;                // in the windows
  double idle_fraction() const { return seconds > 0 ? wait_seconds / seconds : 0; }
};

struct Summary {
  Evaluation evaluation;  // after the last epoch
  // The best held-out evaluation of the run (resumes included): its measure (value) and step;
  // best_step -1: none was taken. stopped_early: --early-stop ended the run.
  Evaluation best;
  int64_t best_step = -1;
  bool stopped_early = false;
  // Whether this process printed the run's log (the job's first rank): a program that prints
  // its own closing line does so where this is true, once per job.
  bool prints = true;
  // This process's training: its seconds in windows (evaluations and checkpoints between them
  // left out), its samples and non-padding tokens (Task::length; 0 without), and their rates
  // over those seconds (0 when it trained nothing: a finished run resumed). samples_seen counts
  // the run's samples since step 0, a resume's included.
  double train_seconds = 0;
  // Of which the first window this process ran: on a GPU it holds the libraries' start (cuBLAS,
  // cuDNN and their kernels loading) and the graphs' capture, once per process.
  double first_window_seconds = 0;
  int64_t samples_trained = 0, tokens_trained = 0, samples_seen = 0;
  double samples_per_second = 0;
  double tokens_per_second = 0;
  int64_t steps = 0;                       // optimizer steps taken
  int64_t skipped_steps = 0;               // of which skipped (non-finite gradient): no update
  double final_loss_scale = 1;             // after the last step (1 without loss scaling)
  size_t peak_activation_bytes = 0;        // of a micro-step, above the baseline
  int64_t micro_batch = 0;                 // used (chosen by --memory-budget, or given)
  size_t peak_bytes = 0;                   // live bytes at the highest point of any micro-step
  double activation_bytes_per_sample = 0;  // --memory-budget's probes
  double activation_fixed_bytes = 0;
  size_t memory_baseline_bytes = 0;
  int64_t buckets_overlapped = 0;  // buckets handed over during backward (--bucket-kib)
  int64_t buckets_at_step = 0;     // and at the boundary
  uint64_t parameter_hash = 0;     // FNV-1a of the final parameters' bytes: equal on every rank
  uint64_t buffer_hash = 0;        // and of the buffers (rank 0's on every rank)
  // Measured with the allocators' statistics once the model, arena and optimizer are built:
  // bytes they hold on the compute device, and in pinned host memory (the offloaded optimizer).
  size_t device_state_bytes = 0;
  size_t host_state_bytes = 0;
  optim::OffloadTraffic offload;     // bytes moved by the offloaded optimizer (zeros otherwise)
  std::vector<StageSummary> stages;  // --pipeline, stage order; empty without
  // --pipeline: every stage's copy of a parameter tied across stages equaled its owner's, bit
  // for bit, at every evaluation and at the end (true without ties).
  bool tied_copies_identical = true;
  // What the host waited for (core/host_waits.h) in the training windows after the run's first
  // (which fills the pools, plans and graphs): summed, and how many windows. Evaluation and
  // checkpoints are outside the windows. On a GPU a window waits once: the boundary's read.
  HostWaits window_waits;
  int64_t windows_measured = 0;
  GraphCounts graphs;  // --cuda-graphs
  // The device at the end: bytes its caching allocator holds from the system (the graph pool
  // included), and what the driver says is in use on it (cudaMemGetInfo; 0 on the CPU).
  size_t device_reserved_bytes = 0;
  size_t device_used_bytes = 0;
  // What this rank held for training after the last step, and the bytes it handed to the
  // collectives over the windows_run windows this process ran.
  Footprint footprint;
  int64_t windows_run = 0;
};

// Trains and evaluates; prints progress and the summary to out (rank 0 only). Metrics
// (--metrics) are written to a temporary beside the file and renamed over it when training
// ends. Throws on failure (run.h turns that into an exit status), and when every step was
// skipped.
Summary train(const Config& config, Task& task, std::ostream& out, const Callbacks& callbacks = {});

}  // namespace accrue::train
