// StepGraphs (step_graphs.h): eager, capture, replay.
#include "train/step_graphs.h"

#include "kernels/profile.h"

namespace accrue::train {

std::string StepGraphs::key_of(const std::vector<Tensor>& inputs) {
  std::string key;
  for (const Tensor& t : inputs) key += dtype_name(t.dtype()) + shape_str(t.shape());
  return key;
}

void StepGraphs::micro_step(optim::Accumulator& acc, int64_t items,
                            const std::vector<Tensor>& inputs, const Loss& loss) {
  const auto eager = [&] {
    ++counts_.eager;
    acc.micro_step(items, [&] { return loss(inputs); });
  };
  if (refused_ || acc.hands_over_in(items)) return eager();
  Entry& e = entries_[key_of(inputs)];
  ++e.seen;
  if (e.graph.defined()) {
    for (size_t i = 0; i < inputs.size(); ++i) e.inputs[i].copy_(inputs[i]);
    acc.replayed_micro_step(
        items,
        [&] { profile_device_work(device_, "graph: micro-step", [&] { e.graph.replay(); }); },
        e.counts);
    ++counts_.replayed;
    return;
  }
  if (e.seen == 1 || counts_.graphs >= max_graphs_) return eager();
  e.inputs.clear();
  for (const Tensor& t : inputs) e.inputs.push_back(t.clone());
  try {
    e.graph = DeviceGraph::capture(device_,
                                   [&] { acc.micro_step(items, [&] { return loss(e.inputs); }); });
  } catch (const NotCapturable& refusal) {
    // Nothing ran and the window is whole: this micro-step and the rest run eagerly.
    refused_ = true;
    entries_.clear();
    counts_.graphs = 0;
    if (log_) log_(str_cat("CUDA graphs: micro-steps run eagerly: ", refusal.what()));
    return eager();
  } catch (const GraphCaptureError&) {
    // The capture recorded the window's clean-up too, and discarded it: run it for real.
    acc.abandon_window();
    throw;
  }
  e.counts = acc.last_counts();
  ++counts_.graphs;
  ++counts_.captured;
  // The capture queued nothing: this micro-step runs now.
  profile_device_work(device_, "graph: micro-step", [&] { e.graph.replay(); });
}

}  // namespace accrue::train
