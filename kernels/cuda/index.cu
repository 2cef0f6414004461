// CUDA indexing: gathering rows by an index (micro-batches from a shuffled on-device dataset).
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"

namespace accrue::cuda {

void CudaBackend::gather_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  // src [N, W words], index [M] -> out [M, W words]; every dtype is a whole number of 4-byte words
  // The row width from out, so an empty source still visits (and flags) every index.
  const int64_t rows = index.numel();
  const int64_t words = rows ? static_cast<int64_t>(out.nbytes() / 4) / rows : 0;
  const uint32_t* in = static_cast<const uint32_t*>(src.raw());
  uint32_t* o = static_cast<uint32_t*>(out.raw());
  const int32_t* idx = index.data<int32_t>();
  const int64_t limit = src.size(0);
  DeviceFault* fault = context(out.device().index).fault;
  // A bad index (the host cannot check a device-resident index without a copy) is recorded as
  // a fault, reported at the next host read, and its row is zeros: nothing is read out of bounds.
  for_each(rows * words, stream_of(out), [=] __device__(int64_t i) {
    const int64_t m = i / words, w = i - m * words;
    const int32_t r = idx[m];
    if (r < 0 || r >= limit) {
      if (w == 0) record_fault(fault, kGatherIndex, r, m, limit);
      o[i] = 0;
      return;
    }
    o[i] = in[int64_t(r) * words + w];
  });
}

}  // namespace accrue::cuda
