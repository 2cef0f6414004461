// Optimizer: the fixed, tiny pipeline that runs once per effective step over the arenas:
//   norm_sq (deterministic two-stage reduction with a non-finite count)
//   -> boundary scalars {norm, clip coefficient, skip} and the applied-step counter, on device
//   -> one fused update pass that scales, applies and zeroes the gradient.
// No host synchronisation happens inside step(); report() reads the scalars back afterwards.
// With a loss scale (set_loss_scaling: mixed precision) the boundary scalars also unscale the
// gradient through the clip coefficient and move the scale, once per step, on the device.
// Subclasses (adam.h, sgd.h) supply only the fused pass and their state.
//
// The step is the same whoever runs around it: a process that updates one slice of the arena
// (ZeRO stage 1, distributed/zero.h) calls restrict_to_slice() and plugs in the seams of
// optim/seams.h: a PartialSumReducer sums the norm's partial sums over the processes, a
// ParameterSync runs after the update, a SliceGather builds full state for checkpoints.
//
// The state lives beside the master weights (ParameterArena::masters_device): on the compute
// device, or in pinned host memory when the masters were offloaded, where the same pipeline runs
// on the CPU backend; the copies to and from the device are optim/offload.h's, a GradientConsumer
// and a ParameterSync like any other piece.
// Read next: accumulator.h.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "optim/arena.h"
#include "optim/seams.h"

namespace accrue::optim {

// The boundary scalars of a step, read back: what the fused pass did. (LossScaling, the
// dynamic loss scale's settings, is kernels/functors.h's: the boundary kernel takes it as is.)
struct BoundaryScalars {
  double grad_norm = 0;   // of the normalised gradient, before clipping
  double clip_coef = 1;   // the factor the raw gradient was multiplied by
  bool skipped = false;   // a non-finite gradient: nothing was updated
  double loss_scale = 1;  // the scale the step's backward was seeded with
};

// Throws ValueError "[op] name must be finite and >= low, got value" (NaN fails too).
void require_finite_at_least(const char* op, const char* name, double value, double low);

class Optimizer {
 public:
  Optimizer(ParameterArena& arena, double lr);
  virtual ~Optimizer();

  // One boundary step over a gradient already normalised (backward seeded with 1 / N, as
  // optim::Accumulator does); max_norm <= 0 disables clipping. A `veto` (one element on the
  // arena's device, undefined: none) that is not zero skips the step like a non-finite gradient:
  // the accumulator's check that the losses counted the planned items, decided on the device.
  // The step is queue_step() then finish_step().
  void step(double max_norm = 0.0, const Tensor& veto = Tensor());
  // The step's device work alone (what a CUDA graph of the boundary captures), and the host's
  // bookkeeping that must follow it, replayed or not.
  void queue_step(double max_norm, const Tensor& veto);
  void finish_step();
  // Whether the step runs with any seam (a reducer, a parameter sync): work outside the device's
  // stream, which a graph cannot hold.
  bool has_seams() const { return reducer_ != nullptr || sync_ != nullptr; }
  // The boundary scalars of the last step() (reads the device).
  BoundaryScalars report() const;
  // The same, from values already read: {norm, coef, skip, scale}.
  static BoundaryScalars report_of(const double* scalars);
  // [4] {norm, clip coefficient, skip, loss scale} of the last step, beside the masters.
  const Tensor& boundary_scalars() const { return boundary_; }
  // Updates applied so far (skipped steps do not count; reads the device).
  int64_t applied_steps() const;

  // From now on this process updates only elements [offset, offset + n) of the arena and keeps
  // optimizer state for them alone, reading their gradient from slice_grads() (which a
  // GradientConsumer fills before each step). Before the first step. Offloaded, the slice's
  // gradient is that of the arena's host copy (the offload copies the slice there).
  // in_arena: slice_grads() is that slice of the gradient arena itself (ZeRO-2's in-place
  // reduce-scatter) instead of a buffer of its own.
  void restrict_to_slice(int64_t offset, int64_t n, bool in_arena = false);
  bool restricted() const { return slice_offset_ >= 0; }
  int64_t slice_offset() const { return slice_offset_; }
  // [n] the gradient of this process's slice (restrict_to_slice), undefined otherwise.
  Tensor& slice_grads() { return grads_; }
  const Tensor& slice_grads() const { return grads_; }
  // The seams (optim/seams.h), null: none. Set before the first step; not owned.
  void set_partial_sum_reducer(PartialSumReducer* reducer) { reducer_ = reducer; }
  void set_parameter_sync(ParameterSync* sync) { sync_ = sync; }
  ParameterSync* parameter_sync() const { return sync_; }
  void set_slice_gather(SliceGather* gather) { gather_ = gather; }
  // A copy of the loss scale on the compute device, which the ParameterSync keeps current (the
  // offloaded optimizer's scaler is on the host): the backward seed reads it instead.
  void mirror_loss_scale(const Tensor& device_copy) { scale_mirror_ = device_copy; }
  // Bytes of optimizer state this rank holds (moments, momentum).
  virtual size_t state_bytes() const = 0;

  // The whole training state of the optimizer, for checkpoints: its per-element state over the
  // full arena (through the SliceGather when restricted: collective, every process calls it), the
  // applied-step counter and the loss scaler, under fixed names ("exp_avg", "momentum_buffer",
  // "steps", "scaler"). load_state() takes the same (each rank keeps its slice) and throws
  // ValueError naming a missing, misshapen or unknown entry, changing nothing; check_state()
  // makes the same checks and copies nothing (a checkpoint is refused while an older one can be
  // named).
  std::vector<nn::NamedTensor> save_state();
  void load_state(const std::map<std::string, Tensor>& state);
  void check_state(const std::map<std::string, Tensor>& state);

  // Dynamic or fixed loss scaling from now on, starting at initial_scale (a power of two keeps
  // the scaling exact). The backward seed reads loss_scale() on the device.
  void set_loss_scaling(const LossScaling& scaling, double initial_scale);
  const LossScaling& loss_scaling() const { return scaling_; }
  bool loss_scaled() const { return scaler_.defined(); }
  // [1] on the arena's device: the current loss scale (undefined without loss scaling).
  Tensor loss_scale() const;
  // {scale, clean windows in a row} read back (checkpoints); {1, 0} without loss scaling.
  std::pair<double, double> scaler_state() const;
  // [2] {loss scale, clean windows} beside the masters; undefined without loss scaling.
  const Tensor& scaler() const { return scaler_; }

  double lr() const { return lr_; }
  void set_lr(double lr);  // throws ValueError unless finite and >= 0
  ParameterArena& arena() { return arena_; }

 protected:
  // The fused pass over params_ and grads_ below; reads boundary_ and applied_steps_ on the device.
  virtual void update() = 0;
  // Reallocates the state for `elements` elements (zeros): restrict_to_slice() calls it.
  virtual void resize_state(int64_t elements) = 0;
  // Where the state lives and runs, and zeros there: beside the masters.
  Device state_device() const { return arena_.masters_device(); }
  Tensor state_zeros(const Shape& shape, DType dtype) const {
    return arena_.state_zeros(shape, dtype);
  }
  // The per-element state tensors (this process's slice when restricted), by name.
  virtual std::vector<nn::NamedTensor> element_state() = 0;

  ParameterArena& arena_;
  double lr_;
  Tensor norm_sq_;        // [2] {sum g^2, non-finite count}
  Tensor boundary_;       // [4] {norm, coef, skip, scale}
  Tensor applied_steps_;  // int32 [1] applied updates
  Tensor scaler_;         // [2] {loss scale, clean windows}, or undefined: no loss scaling
  LossScaling scaling_;
  // What update() works on: the whole arena, or this process's slice of the parameters and the
  // slice's gradient when restricted; and the 16-bit working copy (or its slice) that the pass
  // rewrites, undefined without one.
  Tensor params_, grads_, working_;

 private:
  // load_state's checks: the {destination, source} pairs it copies.
  std::vector<std::pair<Tensor, Tensor>> state_copies(const std::map<std::string, Tensor>& state);
  Tensor scale_mirror_;        // mirror_loss_scale(), or undefined
  int64_t slice_offset_ = -1;  // restrict_to_slice; -1: the whole arena
  PartialSumReducer* reducer_ = nullptr;
  ParameterSync* sync_ = nullptr;
  SliceGather* gather_ = nullptr;
  bool stepped_ = false;
};

}  // namespace accrue::optim
