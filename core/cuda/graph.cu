// CUDA graphs by stream capture (core/graph.h): the device's stream is captured in relaxed mode,
// since the caching allocator may call cudaMalloc for a block a capture needs (the graph pool);
// nothing else that runs during a capture may wait for the device, which the runtime enforces by
// invalidating the capture.
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/cuda_seam.h"

namespace accrue {

void cuda_begin_capture(Device device) {
  cudaStream_t s = cuda::runtime(device.index).stream;
  ACCRUE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
}

void* cuda_end_capture(Device device, size_t& nodes) {
  cudaStream_t s = cuda::runtime(device.index).stream;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &graph);
  if (ended != cudaSuccess) {
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw GraphCaptureError(str_cat("[graph] the capture on cuda:", device.index,
                                    " was invalidated: ", cudaGetErrorString(ended),
                                    " (a call inside it waited for the device or is not "
                                    "capturable)"));
  }
  nodes = 0;
  cudaGraphExec_t exec = nullptr;
  cudaError_t status = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (status == cudaSuccess) status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  // Uploading now keeps the first replay from paying for it inside a window.
  if (status == cudaSuccess) status = cudaGraphUpload(exec, s);
  if (status != cudaSuccess) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    cudaGetLastError();
    throw GraphCaptureError(str_cat("[graph] the graph captured on cuda:", device.index,
                                    " could not be instantiated: ", cudaGetErrorString(status)));
  }
  return exec;
}

void cuda_abort_capture(Device device) {
  cudaStream_t s = cuda::runtime(device.index).stream;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capturing) == cudaSuccess &&
      capturing != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(s, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  cudaGetLastError();  // the error that stopped the capture is reported by the caller
}

void cuda_launch_graph(void* graph, Device device) {
  cudaStream_t s = cuda::runtime(device.index).stream;
  ACCRUE_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), s));
}

void cuda_destroy_graph(void* graph) {
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

bool cuda_capturing(Device device) {
  cudaStream_t s = cuda::runtime(device.index).stream;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ACCRUE_CUDA_CHECK(cudaStreamIsCapturing(s, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace accrue
