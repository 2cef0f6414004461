// The accumulation driver (see accumulator.h).
#include "optim/accumulator.h"

#include <cmath>

#include "core/allocator.h"
#include "core/graph.h"
#include "kernels/backend.h"
#include "kernels/factories.h"
#include "kernels/profile.h"
#include "ops/autograd.h"

namespace accrue::optim {

// The captured boundary step and the host arguments it was captured with; `last` is the previous
// boundary's arguments, so a graph is captured only once they repeat.
struct Accumulator::BoundaryGraph {
  struct Key {
    double lr, max_norm;
    bool veto, scaled;  // the count checked on the device; a loss scale
    bool operator==(const Key& o) const {
      return lr == o.lr && max_norm == o.max_norm && veto == o.veto && scaled == o.scaled;
    }
  };
  DeviceGraph graph;
  Key key{}, last{-1, 0, false, false};
};

Accumulator::Accumulator(Optimizer& optimizer, AccumulatorOptions options)
    : optimizer_(optimizer),
      options_(options),
      readback_(Tensor::zeros({7}, optimizer.arena().dtype(), optimizer.arena().device())),
      sums_(readback_.narrow(0, 3)),
      scalars_(readback_.narrow(3, 4)),
      loss_sum_(readback_.narrow(0, 1).view({})),
      count_sum_(readback_.narrow(1, 1).view({})),
      stop_votes_(readback_.narrow(2, 1).view({})),
      seed_(Tensor::zeros({}, optimizer.arena().dtype(), optimizer.arena().device())),
      planned_(Tensor::zeros({}, optimizer.arena().dtype(), optimizer.arena().device())),
      count_error_(Tensor::zeros({}, optimizer.arena().dtype(), optimizer.arena().device())),
      veto_(Tensor::zeros({}, optimizer.arena().dtype(), optimizer.arena().device())) {
  if (std::isnan(options.max_norm)) throw ValueError("[accumulator] max_norm is NaN");
  if (options_.bucket_bytes > 0 && options_.gradients != nullptr) plan_buckets();
}

void Accumulator::plan_buckets() {
  // Reverse registration order is reverse layer order: the order backward finishes them.
  ParameterArena& arena = optimizer_.arena();
  const auto& entries = arena.entries();
  const size_t element = dtype_size(arena.dtype());
  int64_t end = arena.size();  // the first bucket takes the arena's padded tail too
  bool open = false;
  for (size_t i = entries.size(); i-- > 0;) {
    if (!open) {
      buckets_.push_back({end, end, 0, 0});
      open = true;
    }
    Bucket& b = buckets_.back();
    b.begin = i == 0 ? 0 : entries[i].offset;
    ++b.params;
    b.pending = b.params;
    bucket_of_[entries[i].param.impl().get()] = buckets_.size() - 1;
    if (static_cast<size_t>(b.end - b.begin) * element >= options_.bucket_bytes) {
      open = false;
      end = b.begin;
    }
  }
}

void Accumulator::reset_buckets() {
  for (Bucket& b : buckets_) b.pending = b.params;
  started_ = 0;
}

void Accumulator::leaf_ready(const TensorImpl& leaf) {
  const auto it = bucket_of_.find(&leaf);
  if (it == bucket_of_.end()) return;
  --buckets_[it->second].pending;
  start_ready_buckets();
}

void Accumulator::start_ready_buckets() {
  while (started_ < buckets_.size() && buckets_[started_].pending == 0) {
    const Bucket& b = buckets_[started_];
    options_.gradients->ready(b.begin, b.end);
    ++started_;
    ++(in_step_ ? at_step_ : overlapped_);
  }
}

void Accumulator::restore_clock(int64_t steps, int64_t skipped) {
  if (window_open_ || steps < 0 || skipped < 0 || skipped > steps) {
    throw ValueError(str_cat("[accumulator] restore_clock(", steps, ", ", skipped,
                             ") needs no open window and 0 <= skipped <= steps"));
  }
  step_clock_ = steps;
  skipped_ = skipped;
}

void Accumulator::set_base_lr(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) {
    throw ValueError(str_cat("[accumulator] base learning rate must be finite and >= 0, got ", lr));
  }
  options_.base_lr = lr;
}

double Accumulator::current_lr() const {
  return options_.base_lr * options_.schedule.factor(step_clock_);
}

void Accumulator::begin_window(int64_t items, int64_t local_items) {
  if (local_items < 0) local_items = items;
  if (items <= 0 || local_items > items) {
    throw ValueError(str_cat("[accumulator] a window needs loss items, got ", items, " (",
                             local_items, " on this rank)"));
  }
  if (window_open_) {
    throw ValueError(str_cat("[accumulator] begin_window(", items, ") while the open window has ",
                             seen_items_, " of ", local_items_,
                             " items accumulated; call step() first"));
  }
  window_items_ = items;
  local_items_ = local_items;
  window_open_ = true;
  // The seed and the plan go to the device once, before the first micro-step.
  const double inv_n = 1.0 / static_cast<double>(items);
  if (optimizer_.loss_scaled()) {
    backend_for(seed_.device())
        .expand_scalar(to_dtype(optimizer_.loss_scale(), seed_.dtype()), inv_n, seed_);
  } else {
    fill_(seed_, inv_n);
  }
  fill_(planned_, static_cast<double>(items));
}

void Accumulator::micro_step(int64_t items, const std::function<Tensor()>& forward) {
  if (window_open_ && seen_items_ > 0 && counted_) {
    throw ValueError("[accumulator] a window's micro-steps all return counts (LossSum) or none");
  }
  run_micro_step(items, forward);
}

void Accumulator::micro_step(int64_t items, const std::function<nn::LossSum()>& forward) {
  if (window_open_ && seen_items_ > 0 && !counted_) {
    throw ValueError("[accumulator] a window's micro-steps all return counts (LossSum) or none");
  }
  check_micro_batch(items);  // before counted_ changes: a refused call changes nothing
  counted_ = true;
  run_micro_step(items, [&] {
    const nn::LossSum loss = forward();
    add_count(loss);  // checks it is one element
    return loss.sum;
  });
}

void Accumulator::add_count(const nn::LossSum& loss) {
  nn::check_count(loss, "accumulator");
  const Tensor& count = loss.count;
  if (count.defined()) {
    backend_for(count_sum_.device())
        .axpy(1.0, to_dtype(count, count_sum_.dtype()).to(count_sum_.device()), count_sum_);
  }
  const LossCounts counted{loss.host_count, count.defined()};
  window_counts_ += counted;
  last_counts_ += counted;
}

void Accumulator::fold_host_count() {
  const double host = window_counts_.host;
  if (host == 0) return;
  if (!window_counts_.device) {
    fill_(count_sum_, host);
  } else {
    fill_(count_error_, host);  // scratch: the boundary writes it again before reading it
    backend_for(count_sum_.device()).axpy(1.0, count_error_, count_sum_);
  }
}

void Accumulator::pipelined_window(const std::function<nn::LossSum(const Tensor& seed)>& run) {
  if (!window_open_ || seen_items_ != 0) {
    throw ValueError("[accumulator] pipelined_window() needs a window just begun");
  }
  CachingAllocator& alloc = allocator_for(optimizer_.arena().device());
  const size_t before = alloc.stats().live_bytes;
  alloc.reset_peak();
  counted_ = true;
  try {
    const nn::LossSum sums = run(seed_);
    if (!sums.sum.defined() || sums.sum.numel() != 1) {
      throw ValueError(
          str_cat("[accumulator] a pipelined window's loss sum must be one element, "
                  "got ",
                  sums.sum.describe()));
    }
    backend_for(loss_sum_.device())
        .axpy(1.0, to_dtype(sums.sum, loss_sum_.dtype()).to(loss_sum_.device()), loss_sum_);
    last_counts_ = {};
    add_count(sums);
  } catch (...) {
    abandon_window();
    throw;
  }
  seen_items_ = local_items_;
  record_memory(alloc, before);
}

Tensor Accumulator::window_seed(const Tensor& loss) const {
  return to_dtype(seed_, loss.dtype()).view(loss.shape());
}

void Accumulator::record_memory(CachingAllocator& alloc, size_t before) {
  const AllocatorStats s = alloc.stats();
  last_live_ = s.live_bytes;
  memory_.baseline_bytes = before;
  memory_.peak_bytes = std::max(memory_.peak_bytes, s.peak_bytes);
  memory_.peak_activation_bytes = std::max(memory_.peak_activation_bytes, s.peak_bytes - before);
  memory_.system_allocs = s.system_allocs;
}

void Accumulator::check_counted_items(double counted) const {
  if (!counted_ && options_.loss_reducer == nullptr) return;
  // A rank without micro-steps in this window sees the other ranks' counts, or none at all
  // when no rank counted (micro-steps that return a bare loss).
  if (!counted_ && counted == 0) return;
  if (counted != static_cast<double>(window_items_)) {
    throw ValueError(str_cat("[accumulator] the losses of step ", step_clock_ + 1, " counted ",
                             counted, " items, but the window plans ", window_items_,
                             " (the dataset's item counts and the loss disagree)"));
  }
}

void Accumulator::check_micro_batch(int64_t items) const {
  if (!window_open_) throw ValueError("[accumulator] micro_step() before begin_window()");
  if (items <= 0 || seen_items_ + items > local_items_) {
    throw ValueError(str_cat("[accumulator] micro-batch of ", items, " items overflows the ",
                             "window: ", seen_items_, " of ", local_items_, " already seen"));
  }
}

void Accumulator::run_micro_step(int64_t items, const std::function<Tensor()>& forward) {
  check_micro_batch(items);
  CachingAllocator& alloc = allocator_for(optimizer_.arena().device());
  const size_t before = alloc.stats().live_bytes;
  const LossCounts counts_before = window_counts_;
  last_counts_ = {};
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
    // The single normalisation: d(window mean loss) / d(micro-batch sum loss) = 1 / N, times
    // the loss scale S when there is one (read on the device: S / N).
    const Tensor seed = window_seed(loss);
    const bool overlap = !buckets_.empty() && seen_items_ + items == local_items_;
    if (overlap) {
      // The window's last backward: each bucket goes to the consumer when its gradients are done.
      ScopedLeafReadyHook hook([this](const TensorImpl& leaf) { leaf_ready(leaf); });
      backward(loss, seed);
    } else {
      backward(loss, seed);
    }
    if (options_.gradients != nullptr) options_.gradients->micro_step_done();
  } catch (const NotCapturable&) {
    // An op refused a CUDA graph's capture before changing anything: the window stays whole, and
    // the caller runs this micro-step again eagerly. Only the forward's tape goes, and the count
    // the host took from it.
    clear_tape();
    window_counts_ = counts_before;
    throw;
  } catch (...) {
    abandon_window();
    throw;
  }
  seen_items_ += items;
  record_memory(alloc, before);
}

void Accumulator::replayed_micro_step(int64_t items, const std::function<void()>& launch,
                                      LossCounts counted) {
  check_micro_batch(items);
  if (seen_items_ > 0 && !counted_) {
    throw ValueError("[accumulator] a window's micro-steps all return counts (LossSum) or none");
  }
  if (hands_over_in(items)) {
    throw ValueError("[accumulator] the window's last micro-step hands buckets over: not replayed");
  }
  try {
    launch();
  } catch (...) {
    abandon_window();
    throw;
  }
  counted_ = true;
  window_counts_ += counted;
  last_counts_ = counted;
  seen_items_ += items;
}

StepResult Accumulator::step() {
  if (!window_open_ || seen_items_ != local_items_) {
    throw ValueError(str_cat("[accumulator] step() after ", seen_items_, " of ", local_items_,
                             " window items; every item must be seen once"));
  }
  StepResult r;
  r.lr = current_lr();
  r.items = window_items_;
  BoundaryScalars report;
  std::vector<double> values;
  try {
    // A count the host summed alone is checked before anything is queued.
    const bool host_only = counts_on_host_only();
    if (host_only) check_counted_items(window_counts_.host);
    if (!buckets_.empty()) {
      // Buckets no backward finished (a rank with no samples in a short window, a parameter
      // without gradient) go to the consumer now, in order. A failure abandons the window, which
      // also clears in_step_.
      for (Bucket& b : buckets_) b.pending = 0;
      in_step_ = true;  // counts the hand-overs below as at the boundary
      start_ready_buckets();
      in_step_ = false;
      reset_buckets();
    }
    if (options_.gradients != nullptr) options_.gradients->finish();
    if (!host_only) fold_host_count();
    if (stop_vote_) fill_(stop_votes_, 1.0);
    if (options_.loss_reducer != nullptr) {
      // Every rank sums them, whether or not it ran a micro-step in this window (a short last
      // window may leave a rank none): the collectives stay matched.
      options_.loss_reducer->sum(sums_);
    }
    optimizer_.set_lr(r.lr);
    run_boundary();
    // With collectives in the step, wait for them under the watchdog first.
    if (options_.loss_reducer != nullptr) options_.loss_reducer->settle();
    // The window's one wait for the device, after the whole step has been queued; it is also
    // where a fault a kernel recorded during the window is reported.
    values = read_boundary();
    if (!host_only) check_counted_items(values[1]);
  } catch (...) {
    abandon_window();
    throw;
  }
  report = Optimizer::report_of(values.data() + 3);
  ++step_clock_;
  r.step = step_clock_;
  r.grad_norm = report.grad_norm;
  r.skipped = report.skipped;
  r.loss_scale = report.loss_scale;
  if (r.skipped) ++skipped_;
  r.loss = values[0] / static_cast<double>(window_items_);
  r.stop = values[2] > 0;
  stop_vote_ = false;
  close_window();
  return r;
}

void Accumulator::set_graph_boundary(bool on) {
  options_.graph_boundary = on;
  if (!on) boundary_graph_.reset();
}

void Accumulator::run_boundary() {
  Backend& be = backend_for(readback_.device());
  const bool same_device = optimizer_.boundary_scalars().device() == readback_.device();
  const bool veto = counted_ && !counts_on_host_only();
  const auto queue = [&] {
    if (veto) {
      // (counted - planned)^2: the device skips the update when the losses miscounted, and the
      // host throws at the read below, so a wrong count never reaches the weights.
      be.binary(BinaryOp::kSub, count_sum_, planned_, count_error_);
      be.binary(BinaryOp::kMul, count_error_, count_error_, veto_);
    }
    optimizer_.queue_step(options_.max_norm, veto ? veto_ : Tensor());
    if (same_device) scalars_.copy_(optimizer_.boundary_scalars());
  };
  const bool graphable = options_.graph_boundary && readback_.device().is_cuda() && same_device &&
                         options_.gradients == nullptr && options_.loss_reducer == nullptr &&
                         !optimizer_.has_seams();
  if (!graphable) {
    queue();
  } else {
    if (!boundary_graph_) boundary_graph_ = std::make_unique<BoundaryGraph>();
    BoundaryGraph& g = *boundary_graph_;
    const BoundaryGraph::Key key{optimizer_.lr(), options_.max_norm, veto,
                                 optimizer_.loss_scaled()};
    const auto replay = [&] {
      profile_device_work(readback_.device(), "graph: boundary", [&] { g.graph.replay(); });
    };
    if (g.graph.defined() && g.key == key) {
      replay();
      ++boundaries_replayed_;
    } else if (g.last == key) {
      g.graph = DeviceGraph::capture(readback_.device(), queue);
      g.key = key;
      replay();
    } else {
      queue();
    }
    g.last = key;
  }
  optimizer_.finish_step();
}

std::vector<double> Accumulator::read_boundary() {
  std::vector<double> values = to_dtype(readback_, DType::kFloat64).to_vector<double>();
  if (optimizer_.boundary_scalars().device() != readback_.device()) {
    // The offloaded optimizer's scalars are on the host: a second read, of host memory.
    const std::vector<double> s =
        to_dtype(optimizer_.boundary_scalars(), DType::kFloat64).to_vector<double>();
    std::copy(s.begin(), s.end(), values.begin() + 3);
  }
  return values;
}

Accumulator::~Accumulator() {
  try {
    // Work in flight writes into the arena, which may go next (an all-reduce), or was started
    // for an unfinished window (a copy to the host).
    if (options_.gradients != nullptr) options_.gradients->abandon();
  } catch (...) {
  }
}

void Accumulator::abandon_window() {
  // Work in flight writes into the arena: it finishes before the arena is zeroed. If waiting
  // fails, the arena is left alone (the job is lost: the trainer aborts every rank).
  const bool arena_free = options_.gradients == nullptr || options_.gradients->abandon();
  if (!buckets_.empty()) reset_buckets();
  in_step_ = false;
  clear_tape();
  if (arena_free) optimizer_.arena().zero_grad();
  close_window();
}

void Accumulator::close_window() {
  readback_.zero_();
  counted_ = false;
  window_counts_ = {};
  window_items_ = local_items_ = 0;
  window_open_ = false;
  seen_items_ = 0;
}

StepResult Accumulator::accumulate_window(const Window& window,
                                          const std::function<Tensor(const MicroBatch&)>& forward) {
  begin_window(window.samples, window.local_samples());
  for (const MicroBatch& mb : window.micro) micro_step(mb.count, [&] { return forward(mb); });
  return step();
}

}  // namespace accrue::optim
