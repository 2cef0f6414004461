// A window's micro-steps: the order of its samples, the micro-batches staged or gathered on the
// device, the CUDA graphs, and the rerun of a window whose capture failed (engine_run.h).
#include "train/engine_run.h"

#include <algorithm>
#include <exception>

#include "nn/norm.h"
#include "train/signals.h"

namespace accrue::train::engine {

// Micro-step graphs held at most: G2P's shapes (micro-batch rows x sequence length) number a few
// dozen; past this a new shape runs eagerly.
constexpr int64_t kMaxStepGraphs = 64;

// Host-built micro-batches are staged (Task::host_samples); micro-steps and the boundary are
// replayed from CUDA graphs on a GPU unless --cuda-graphs off (pipeline stages run eagerly).
void Run::setup_device_path() {
  prepare_backend(c_.device);
  if (task_.host_samples) stager_ = std::make_unique<HostToDevice>(c_.device);
  if (c_.device.is_cuda() && c_.cuda_graphs != CudaGraphs::kOff &&
      strategies_->window_runner() == nullptr && !strategies_->works_in_micro_steps()) {
    graphs_ = std::make_unique<StepGraphs>(c_.device, kMaxStepGraphs,
                                           [this](const std::string& line) { log(line); });
  }
}

// With Task::length, each window's share of this rank (its micro-batches are one contiguous
// range of the order) is sorted by length, stably: every rank computes the same order, the
// window's sum is the same, and a micro-batch pads only to its own longest sequence.
void Run::order_shares_by_length(const EpochPlan& plan, std::vector<int32_t>& order) const {
  if (!task_.length) return;
  for (const optim::Window& w : plan.windows) {
    if (w.micro.empty()) continue;
    const auto begin = order.begin() + w.micro.front().start;
    const auto end = order.begin() + w.micro.back().start + w.micro.back().count;
    std::vector<std::pair<int64_t, int32_t>> keyed;
    for (auto it = begin; it != end; ++it) keyed.emplace_back(task_.length(*it), *it);
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < keyed.size(); ++i) begin[static_cast<int64_t>(i)] = keyed[i].second;
  }
}

// The window's non-padding tokens over every rank (Task::length), 0 without.
int64_t Run::tokens_of(const optim::Window& w, const std::vector<int32_t>& order) const {
  if (!task_.length) return 0;
  int64_t n = 0;
  for (int64_t i = w.start; i < w.start + w.samples; ++i) n += task_.length(order[i]);
  return n;
}

// One window: each micro-batch's samples, their loss and its count, through the accumulator.
// The window's items (its normaliser) come from the plan: the dataset's per-sample counts over
// every rank's share, summed without a collective. A CUDA graph that cannot be captured (a
// dropout, a call that waits for the device) turns graphs off, under --cuda-graphs auto, and
// the window runs again eagerly from its start (the failed capture abandoned it).
optim::StepResult Run::run_window(const optim::Window& w, const Tensor& order,
                                  const std::vector<int32_t>& order_host) {
  try {
    return run_window_once(w, order, order_host);
  } catch (const GraphCaptureError& e) {
    if (c_.cuda_graphs == CudaGraphs::kOn) throw;
    log(str_cat("CUDA graphs off for the rest of the run: ", e.what()));
    if (graphs_) graph_counts_ = graphs_->counts();
    graphs_.reset();
    acc_->set_graph_boundary(false);
    return run_window_once(w, order, order_host);
  }
}

// The loss items of the samples at positions [start, start + count) of the epoch's order.
int64_t Run::items_in(const std::vector<int32_t>& order, int64_t start, int64_t count) const {
  if (!task_.items) return count;
  int64_t n = 0;
  for (int64_t i = start; i < start + count; ++i) n += task_.items(order[static_cast<size_t>(i)]);
  return n;
}

optim::StepResult Run::run_window_once(const optim::Window& w, const Tensor& order,
                                       const std::vector<int32_t>& order_host) {
  acc_->begin_window(items_in(order_host, w.start, w.samples), [&] {
    int64_t n = 0;
    for (const optim::MicroBatch& mb : w.micro) n += items_in(order_host, mb.start, mb.count);
    return n;
  }());
  ++summary_.windows_run;
  strategies_->begin_window(w);
  if (Strategy* runner = strategies_->window_runner()) {
    acc_->pipelined_window([&](const Tensor& seed) {
      return runner->run_micro_batches(*model_, WindowRun{w, order, seed, acc_->step_clock()});
    });
  } else {
    run_micro_steps(w, order, order_host);
  }
  if (stop_requested() != 0) acc_->request_stop();
  const optim::StepResult r = acc_->step();
  // What the rank holds after a step (ZeRO-3's layers are released by then).
  summary_.footprint = strategies_->footprint(*arena_, *optimizer_);
  // The step read the device, after every copy staged for this window.
  if (stager_) stager_->release_waited();
  broadcast_buffers();
  return r;
}

// The window's micro-steps. A micro-step's inputs are its samples' positions in the training
// set (Task::samples gathers them on the device), or its samples assembled on the host
// (Task::host_samples), staged one micro-batch ahead so the copy of the next runs while this one
// computes; either way through the micro-step graphs when there are.
void Run::run_micro_steps(const optim::Window& w, const Tensor& order,
                          const std::vector<int32_t>& order_host) {
  struct Staged {
    HostToDevice::Pending input, target;
  };
  const auto stage = [&](const optim::MicroBatch& mb) {
    const std::vector<int32_t> rows(order_host.begin() + mb.start,
                                    order_host.begin() + mb.start + mb.count);
    const Samples host = task_.host_samples(Tensor::from_vector<int32_t>({mb.count}, rows));
    return Staged{stager_->stage(host.input), stager_->stage(host.target)};
  };
  // An exception leaves copies staged and never waited for: the stream waits for them before
  // their blocks go to other work (a window run again after a failed graph capture).
  struct DiscardOnUnwind {
    HostToDevice* stager;
    ~DiscardOnUnwind() {
      if (stager == nullptr || std::uncaught_exceptions() == 0) return;
      try {
        stager->discard_pending();
      } catch (...) {  // the exception in flight says what went wrong
      }
    }
  } discard{stager_.get()};
  std::optional<Staged> next;
  if (stager_ && !w.micro.empty()) next = stage(w.micro.front());
  for (size_t m = 0; m < w.micro.size(); ++m) {
    const optim::MicroBatch& mb = w.micro[m];
    const Tensor index = order.narrow(mb.start, mb.count);
    std::vector<Tensor> inputs{index};
    if (stager_) {
      Staged current = std::move(*next);
      if (m + 1 < w.micro.size()) next = stage(w.micro[m + 1]);
      inputs = {stager_->ready(current.input), stager_->ready(current.target)};
    }
    const auto loss = [&](const std::vector<Tensor>& in) {
      // Dropout's masks are keyed by the samples and the optimizer step, not the split.
      const nn::SampleKeys keys(c_.seed, acc_->step_clock(), index);
      const Samples batch = stager_ ? Samples{in[0], in[1]} : task_.samples(in[0]);
      return task_.loss(*model_, batch, master_);
    };
    const int64_t items = items_in(order_host, mb.start, mb.count);
    if (graphs_) {
      graphs_->micro_step(*acc_, items, inputs, loss);
    } else {
      acc_->micro_step(items, [&] { return loss(inputs); });
    }
  }
}

}  // namespace accrue::train::engine
