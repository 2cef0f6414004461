// --cuda-graphs: the training loop's micro-steps as CUDA graphs (core/graph.h). A micro-step is
// keyed by its inputs' shapes and dtypes. The first micro-step of a key runs eagerly (it sizes
// every scratch buffer, library plan and algorithm choice that a capture must find ready); the
// second is captured, into tensors of its own that hold the inputs, and then replayed; every later
// one copies its inputs into those tensors (device to device, on the stream) and replays. The
// graph holds forward, loss and backward into the gradient arena, and the window's sums; the
// accumulator keeps the window's bookkeeping (optim::Accumulator::replayed_micro_step).
//
// Shapes that vary (G2P's sequence lengths) get a graph each, up to max_graphs, past which a
// key runs eagerly: the graphs share one memory pool (allocator.h), so more graphs cost capture
// time, not memory, and the eager and replayed runs compute the same shapes, bit for bit. The
// micro-step that hands buckets to a gradient consumer during its backward (overlapped
// communication) always runs eagerly. Read next: engine.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/graph.h"
#include "nn/loss.h"
#include "optim/accumulator.h"

namespace accrue::train {

struct GraphCounts {
  int64_t eager = 0, captured = 0, replayed = 0;  // micro-steps
  int64_t graphs = 0;                             // held
  int64_t boundaries_replayed = 0;                // filled by the engine from the accumulator
};

class StepGraphs {
 public:
  StepGraphs(Device device, int64_t max_graphs, std::function<void(const std::string&)> log)
      : device_(device), max_graphs_(max_graphs), log_(std::move(log)) {}

  // The micro-step's loss from its inputs (the tensors given to micro_step, or during capture
  // and replays the graph's own copies of them). Its host count follows from the inputs' shapes
  // (nn::LossSum): a replay adds the count of its capture.
  using Loss = std::function<nn::LossSum(const std::vector<Tensor>& inputs)>;
  // One micro-step of `items` loss items through acc: eager, captured then replayed, or
  // replayed. When an op of the model refuses to be captured (NotCapturable: a dropout, a
  // BatchNorm in training) the micro-step runs eagerly and so does every later one, said once
  // through `log`. Throws GraphCaptureError (the accumulator's window abandoned) when a capture
  // fails otherwise.
  void micro_step(optim::Accumulator& acc, int64_t items, const std::vector<Tensor>& inputs,
                  const Loss& loss);
  const GraphCounts& counts() const { return counts_; }

 private:
  struct Entry {
    int64_t seen = 0;            // micro-steps of this key so far
    std::vector<Tensor> inputs;  // what the graph reads
    DeviceGraph graph;
    optim::Accumulator::LossCounts counts;  // what the captured micro-step's loss counted
  };
  static std::string key_of(const std::vector<Tensor>& inputs);

  Device device_;
  int64_t max_graphs_;
  std::function<void(const std::string&)> log_;
  bool refused_ = false;  // an op of the model cannot be captured
  std::map<std::string, Entry> entries_;
  GraphCounts counts_;
};

}  // namespace accrue::train
