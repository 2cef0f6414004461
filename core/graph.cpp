// DeviceGraph (graph.h): the capture's bracket around the caller's function, the allocator's
// graph pool around the same bracket, and the executable graph's lifetime. The CUDA calls are
// in core/cuda/graph.cu behind core/cuda_seam.h.
#include "core/graph.h"

#include <utility>

#include "core/allocator.h"
#include "core/cuda_seam.h"
#include "core/error.h"

namespace accrue {

DeviceGraph::~DeviceGraph() {
  if (exec_ != nullptr) cuda_destroy_graph(exec_);
}

DeviceGraph::DeviceGraph(DeviceGraph&& o) noexcept
    : exec_(std::exchange(o.exec_, nullptr)), device_(o.device_), nodes_(o.nodes_) {}

DeviceGraph& DeviceGraph::operator=(DeviceGraph&& o) noexcept {
  if (this != &o) {
    if (exec_ != nullptr) cuda_destroy_graph(exec_);
    exec_ = std::exchange(o.exec_, nullptr);
    device_ = o.device_;
    nodes_ = o.nodes_;
  }
  return *this;
}

DeviceGraph DeviceGraph::capture(Device device, const std::function<void()>& fn) {
  if (!device.is_cuda()) {
    throw DeviceError(str_cat("[graph] CUDA graphs need a GPU, not ", device.str()));
  }
  CachingAllocator& alloc = allocator_for(device);
  DeviceGraph g;
  g.device_ = device;
  alloc.begin_graph_capture();
  try {
    cuda_begin_capture(device);
  } catch (...) {
    alloc.end_graph_capture();
    throw;
  }
  try {
    fn();
  } catch (const NotCapturable&) {
    alloc.end_graph_capture();
    cuda_abort_capture(device);
    throw;
  } catch (const std::exception& e) {
    alloc.end_graph_capture();
    cuda_abort_capture(device);
    throw GraphCaptureError(str_cat("[graph] capture on ", device.str(), " failed: ", e.what()));
  } catch (...) {
    alloc.end_graph_capture();
    cuda_abort_capture(device);
    throw;
  }
  const size_t survivors = alloc.end_graph_capture();
  g.exec_ = cuda_end_capture(device, g.nodes_);
  if (survivors > 0) {
    // Every other graph's replays would write them: the graph is not kept.
    throw GraphCaptureError(str_cat("[graph] ", survivors, " tensor(s) made during the capture on ",
                                    device.str(), " outlive it"));
  }
  return g;
}

void DeviceGraph::replay() const {
  if (exec_ == nullptr) throw ValueError("[graph] replay() of a graph that was never captured");
  cuda_launch_graph(exec_, device_);
}

bool graph_capturing(Device device) {
  return device.is_cuda() && cuda_capturing(device);
}

}  // namespace accrue
