// The accumulation driver: the one owner of the window. For each window it
//   1. runs every micro-step: forward (the caller's function returns the micro-batch's
//      sum-reduced loss, and with a LossSum the number of loss items it sums over), then
//      backward seeded with 1 / N_window, where N_window counts the window's loss items
//      (samples for classification, target tokens for a sequence model) over every rank, known
//      from the plan before the first micro-step; so each micro-batch adds exactly its share of
//      the window's mean-loss gradient into the arena, whatever the micro-batch sizes (this
//      seed is the only place in accrue that normalises); with a loss
//      scale S (Optimizer::set_loss_scaling) the seed is S / N_window, read on the device, and
//      the optimizer's boundary step unscales, checks and moves S once for the whole window;
//   2. hands the window's gradient to its GradientConsumer (optim/seams.h), if any: bucket by
//      bucket during the last micro-backward when buckets are planned, and finish() at the
//      boundary (an all-reduce over data-parallel ranks, a reduce-scatter, a copy to the host;
//      never during earlier micro-steps: N_window counts the items of every rank, so the sum
//      of the ranks' arenas is exactly the window's gradient), and the loss sum to its
//      PartialSumReducer; then sets the learning rate from the optimizer-step clock and runs
//      the optimizer's fused step (norm -> clip -> update -> zero).
// It also measures what accumulation is for: the activation memory of one micro-step above
// the baseline of parameters, gradients, optimizer state and data. Read next:
// train/task.h.
#pragma once

#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "nn/loss.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "optim/window.h"

namespace accrue::optim {

struct AccumulatorOptions {
  double max_norm = 0.0;  // clip the window's gradient norm; <= 0: no clipping
  double base_lr = 1e-3;  // after batch scaling; the schedule multiplies it
  Schedule schedule;
  // Takes the window's gradient (optim/seams.h: an all-reduce, ZeRO's reduce-scatter, the
  // offloaded optimizer's copy to the host); null: the optimizer reads the arena as it is.
  GradientConsumer* gradients = nullptr;
  // Sums the window's loss over the processes; null: this process alone.
  PartialSumReducer* loss_reducer = nullptr;
  // > 0 (with a consumer): overlap the consumer's work with the window's last backward. The
  // arena is cut into buckets of about this many bytes in reverse layer order, and each bucket
  // goes to the consumer as soon as backward has finished its gradients. 0: all at the boundary.
  size_t bucket_bytes = 0;
  // On a GPU, capture the boundary step's device work as a CUDA graph (core/graph.h) when it
  // repeats with the same host arguments (learning rate, clip), and replay it. Only a boundary
  // without seams (no consumer, reducer or parameter sync: one process) can be captured.
  bool graph_boundary = false;
};

// What one optimizer step did (read back from the device after the step).
struct StepResult {
  int64_t step = 0;       // 1-based optimizer step
  int64_t items = 0;      // loss items in the window (samples, or target tokens), every rank
  double loss = 0;        // mean loss over the window's items
  double grad_norm = 0;   // of the window's mean-loss gradient, before clipping
  double lr = 0;          // used by this step
  bool skipped = false;   // non-finite gradient: no update
  double loss_scale = 1;  // the loss scale of the window (mixed precision), before its update
  bool stop = false;      // some rank asked to stop after this step (request_stop)
};

struct MemoryStats {
  size_t baseline_bytes = 0;         // live bytes between micro-steps
  size_t peak_activation_bytes = 0;  // max over micro-steps of (peak - baseline)
  size_t peak_bytes = 0;             // max live bytes seen during micro-steps
  int64_t system_allocs = 0;         // allocator system calls so far
};

class Accumulator {
 public:
  Accumulator(Optimizer& optimizer, AccumulatorOptions options);
  ~Accumulator();  // the consumer waits for work still in flight
  Accumulator(const Accumulator&) = delete;
  Accumulator& operator=(const Accumulator&) = delete;

  // Opens a window of `items` loss items over every rank, `local_items` of them on this rank
  // (the sum over its micro-batches; -1: all of them, one rank).
  void begin_window(int64_t items, int64_t local_items = -1);
  // One micro-step of `items` loss items: forward() returns their sum-reduced loss (0-d). If
  // forward or backward throws, the window is abandoned (abandon_window()) before rethrowing.
  void micro_step(int64_t items, const std::function<Tensor()>& forward);
  // The same with the loss's own count of its items (nn::LossSum): the counts are summed, over
  // the ranks too, and step() throws ValueError naming both when the window's sum differs from
  // the planned items. A count tensor is summed where it is (on the device: unmasked tokens); a
  // host count (LossSum::host_count) is summed on the host and written into the sum once, at the
  // boundary: no kernel per micro-step.
  void micro_step(int64_t items, const std::function<nn::LossSum()>& forward);
  // Pipeline stages (distributed/pipeline.h): the window's micro-batches run through every
  // stage at once, so the caller runs them all: run(seed) runs backward seeded with `seed` (1 / N,
  // or S / N with a loss scale, 0-d on the arena's device) and returns the loss sum and item count
  // of the micro-batches whose loss this stage computed (the last stage; zeros elsewhere). The
  // boundary's sums over every rank then count each item once, and step() follows as usual.
  void pipelined_window(const std::function<nn::LossSum(const Tensor& seed)>& run);
  // Drops the open window: empties the tape, zeroes the gradient arena and the loss sum, so the
  // next window starts clean and no partial gradient reaches an update.
  void abandon_window();
  // Closes the window with one optimizer step; checks that every sample was seen.
  StepResult step();
  // This process asks every rank to stop after the next step: the vote is summed with the
  // window's loss in the boundary's all-reduce, and that step's StepResult::stop is true on
  // every rank.
  void request_stop() { stop_vote_ = true; }

  // CUDA graphs of micro-steps (train/step_graphs.h): a micro-step of `items` loss items whose
  // device work launch() queues (a graph captured from an earlier micro_step() with a LossSum);
  // the window's bookkeeping is that micro_step()'s, and `counted` what its loss counted
  // (last_counts() after it: a graph holds the device's count, not the host's).
  struct LossCounts {
    double host = 0;      // LossSum::host_count, summed
    bool device = false;  // a count tensor was added on the device
    LossCounts& operator+=(const LossCounts& o) {
      host += o.host;
      device = device || o.device;
      return *this;
    }
  };
  void replayed_micro_step(int64_t items, const std::function<void()>& launch, LossCounts counted);
  // What the last micro-step's loss counted.
  LossCounts last_counts() const { return last_counts_; }
  // Whether the micro-step of `items` items that comes next hands buckets to the consumer during
  // its backward (host work that a graph cannot hold).
  bool hands_over_in(int64_t items) const {
    return !buckets_.empty() && seen_items_ + items == local_items_;
  }
  // Boundary steps replayed from a graph so far (graph_boundary), and turning that off.
  int64_t boundaries_replayed() const { return boundaries_replayed_; }
  void set_graph_boundary(bool on);

  // Convenience: one whole window of the plan whose items are its samples (one loss item per
  // sample, as in classification), with forward(micro) per micro-batch.
  StepResult accumulate_window(const Window& window,
                               const std::function<Tensor(const MicroBatch&)>& forward);

  int64_t step_clock() const { return step_clock_; }  // windows stepped: the schedules' clock
  // The learning rate before the schedule's factor, from the next step on (an accumulation
  // schedule moves the effective batch, and --lr-scaling moves the rate with it).
  void set_base_lr(double lr);
  // Continues a run from a checkpoint: the optimizer-step clock and the skipped count.
  void restore_clock(int64_t steps, int64_t skipped);
  double current_lr() const;
  const MemoryStats& memory() const { return memory_; }
  size_t last_micro_live_bytes() const { return last_live_; }  // live bytes after a micro-step
  int64_t skipped_steps() const { return skipped_; }
  // Buckets handed to the consumer during a backward (overlapped), and in step(), so far.
  int64_t buckets_overlapped() const { return overlapped_; }
  int64_t buckets_at_step() const { return at_step_; }

 private:
  Optimizer& optimizer_;
  AccumulatorOptions options_;
  int64_t step_clock_ = 0, skipped_ = 0;
  int64_t window_items_ = 0;  // N of the open window over every rank; 0: none open
  int64_t local_items_ = 0;   // of which this rank's
  bool window_open_ = false;
  int64_t seen_items_ = 0;
  // [7] on the arena's device, read by the host once per window, at the boundary: the window's
  // loss sum, the items its losses counted (LossSum micro-steps) and the stop votes, which are
  // summed over the ranks in one collective (`sums_`), then the optimizer's boundary scalars
  // {norm, clip coefficient, skip, loss scale}, copied there after the step.
  Tensor readback_;
  Tensor sums_, scalars_;                     // [3] and [4] views of it
  Tensor loss_sum_, count_sum_, stop_votes_;  // 0-d views of its elements
  // 0-d, written at begin_window: the backward seed 1 / N (or S / N), and N itself, so that no
  // kernel of a micro-step or of the boundary takes either as an argument (a graph replays them).
  Tensor seed_, planned_;
  Tensor count_error_, veto_;  // 0-d scratch: counted - planned, and its square
  bool stop_vote_ = false;
  bool counted_ = false;                    // the open window's micro-steps returned counts
  LossCounts window_counts_, last_counts_;  // the open window's, the last micro-step's
  // Throws unless a window is open and `items` fits in what it has left.
  void check_micro_batch(int64_t items) const;
  // The micro-step without its bookkeeping of counts.
  void run_micro_step(int64_t items, const std::function<Tensor()>& forward);
  // The backward seed of the open window for a loss like `loss` (its dtype and shape).
  Tensor window_seed(const Tensor& loss) const;
  // The boundary's device work: the count veto, the optimizer's step and the copy of its scalars
  // into readback_, eager or from the boundary graph.
  void run_boundary();
  // The one host read of the window: readback_ as float64.
  std::vector<double> read_boundary();
  struct BoundaryGraph;
  std::unique_ptr<BoundaryGraph> boundary_graph_;
  int64_t boundaries_replayed_ = 0;
  // count_sum_ += loss.count (one element, when defined); the host count into the LossCounts.
  void add_count(const nn::LossSum& loss);
  // Whether the open window's count is checked on the host, before the boundary is queued: every
  // count came on the host and no other rank adds to it. Then no kernel checks it either.
  bool counts_on_host_only() const {
    return counted_ && !window_counts_.device && options_.loss_reducer == nullptr;
  }
  // Writes the window's host count into count_sum_: at the boundary, before the sums' all-reduce.
  void fold_host_count();
  // The memory statistics of a micro-step (or a pipelined window) that began at `before` live
  // bytes, with the allocator's peak reset then.
  void record_memory(CachingAllocator& alloc, size_t before);
  // Throws unless the items the losses counted (read at the boundary) equal the window's.
  void check_counted_items(double counted) const;
  // Zeroes the window's sums and closes it.
  void close_window();
  MemoryStats memory_;
  size_t last_live_ = 0;

  // Buckets (bucket_bytes > 0): arena ranges in reverse layer order, the number of parameters of
  // each still to finish, and how many have gone to the consumer (always a prefix, so every
  // rank hands them over in the same order).
  struct Bucket {
    int64_t begin, end;  // in arena elements
    int params;          // parameters in the bucket
    int pending;         // of which backward has not finished yet
  };
  void plan_buckets();
  void leaf_ready(const TensorImpl& leaf);
  void start_ready_buckets();
  void reset_buckets();
  std::vector<Bucket> buckets_;
  std::unordered_map<const TensorImpl*, size_t> bucket_of_;
  size_t started_ = 0;
  bool in_step_ = false;
  int64_t overlapped_ = 0, at_step_ = 0;
};

}  // namespace accrue::optim
