// The accumulation driver (see accumulator.h).
#include "optim/accumulator.h"

#include <cmath>

#include "core/allocator.h"
#include "core/autograd.h"
#include "kernels/backend.h"

namespace accrue::optim {

Accumulator::Accumulator(Optimizer& optimizer, AccumulatorOptions options)
    : optimizer_(optimizer),
      options_(options),
      loss_sum_(Tensor::zeros({}, optimizer.arena().dtype(), optimizer.arena().device())) {
  if (std::isnan(options.max_norm)) throw ValueError("[accumulator] max_norm is NaN");
}

double Accumulator::current_lr() const {
  return options_.base_lr * options_.schedule.factor(steps_);
}

void Accumulator::begin_window(int64_t samples, int64_t local_samples) {
  if (local_samples < 0) local_samples = samples;
  if (samples <= 0 || local_samples > samples) {
    throw ValueError(str_cat("[accumulator] a window needs samples, got ", samples, " (",
                             local_samples, " on this rank)"));
  }
  if (window_open_) {
    throw ValueError(str_cat("[accumulator] begin_window(", samples, ") while the open window has ",
                             seen_samples_, " of ", local_samples_,
                             " samples accumulated; call step() first"));
  }
  window_samples_ = samples;
  local_samples_ = local_samples;
  window_open_ = true;
}

void Accumulator::micro_step(int64_t samples, const std::function<Tensor()>& forward) {
  if (!window_open_) throw ValueError("[accumulator] micro_step() before begin_window()");
  if (samples <= 0 || seen_samples_ + samples > local_samples_) {
    throw ValueError(str_cat("[accumulator] micro-batch of ", samples, " samples overflows the ",
                             "window: ", seen_samples_, " of ", local_samples_, " already seen"));
  }
  CachingAllocator& alloc = allocator_for(optimizer_.arena().device());
  const size_t before = alloc.stats().live_bytes;
  alloc.reset_peak();
  try {
    const Tensor loss = forward();
    if (!loss.defined() || loss.numel() != 1 || !loss.requires_grad()) {
      throw ValueError(
          str_cat("[accumulator] forward must return the micro-batch's sum-reduced "
                  "loss as a one-element tensor that requires grad, got ",
                  loss.describe()));
    }
    backend_for(loss.device()).axpy(1.0, loss, loss_sum_);
    // The single normalisation: d(window mean loss) / d(micro-batch sum loss) = 1 / N.
    loss.backward(1.0 / static_cast<double>(window_samples_));
  } catch (...) {
    abandon_window();
    throw;
  }
  seen_samples_ += samples;
  const AllocatorStats s = alloc.stats();
  last_live_ = s.live_bytes;
  memory_.baseline_bytes = before;
  memory_.peak_bytes = std::max(memory_.peak_bytes, s.peak_bytes);
  memory_.peak_activation_bytes = std::max(memory_.peak_activation_bytes, s.peak_bytes - before);
  memory_.system_allocs = s.system_allocs;
}

StepResult Accumulator::step() {
  if (!window_open_ || seen_samples_ != local_samples_) {
    throw ValueError(str_cat("[accumulator] step() after ", seen_samples_, " of ", local_samples_,
                             " window samples; every sample must be seen once"));
  }
  StepResult r;
  r.lr = current_lr();
  r.samples = window_samples_;
  StepReport report;
  try {
    if (options_.comm != nullptr && options_.comm->world_size() > 1) {
      // The one exchange of the window: every rank's share of the window gradient, summed (a
      // sharded optimizer reduce-scatters it itself).
      if (!optimizer_.sharded()) options_.comm->all_reduce_sum(optimizer_.arena().grads());
      options_.comm->all_reduce_sum(loss_sum_);
    }
    optimizer_.set_lr(r.lr);
    optimizer_.step(options_.max_norm, 1.0);
    // Reading the report waits for the device, after the whole step has been enqueued; it is
    // also where a fault a kernel recorded during the window is reported.
    report = optimizer_.report();
  } catch (...) {
    abandon_window();
    throw;
  }
  ++steps_;
  r.step = steps_;
  r.grad_norm = report.grad_norm;
  r.skipped = report.skipped;
  if (r.skipped) ++skipped_;
  r.loss = loss_sum_.item() / static_cast<double>(window_samples_);
  loss_sum_.zero_();
  window_samples_ = local_samples_ = 0;
  window_open_ = false;
  seen_samples_ = 0;
  return r;
}

void Accumulator::abandon_window() {
  clear_tape();
  optimizer_.arena().zero_grad();
  loss_sum_.zero_();
  window_samples_ = local_samples_ = 0;
  window_open_ = false;
  seen_samples_ = 0;
}

StepResult Accumulator::run_window(const Window& window,
                                   const std::function<Tensor(const MicroBatch&)>& forward) {
  begin_window(window.samples, window.local_samples());
  for (const MicroBatch& mb : window.micro) micro_step(mb.count, [&] { return forward(mb); });
  return step();
}

}  // namespace accrue::optim
