// CUDA indexing: gathering rows by an index (micro-batches from a shuffled on-device dataset).
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"

namespace accrue::cuda {

namespace {

// out [M, units] = src [index[m], units] in units of U (4 or 2 bytes). A bad index (the host
// cannot check a device-resident index without a copy) is recorded as a fault, reported at the
// next host read, and its row is zeros: nothing is read out of bounds.
template <typename U>
void gather_units(const U* in, const int32_t* idx, int64_t rows, int64_t units, int64_t limit,
                  DeviceFault* fault, U* o, cudaStream_t stream) {
  for_each(rows * units, stream, [=] __device__(int64_t i) {
    const int64_t m = i / units, w = i - m * units;
    const int32_t r = idx[m];
    if (r < 0 || r >= limit) {
      if (w == 0) record_fault(fault, kGatherIndex, r, m, limit);
      o[i] = 0;
      return;
    }
    o[i] = in[int64_t(r) * units + w];
  });
}

}  // namespace

void CudaBackend::gather_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  // src [N, row bytes], index [M] -> out [M, row bytes], copied in 4-byte words when rows and
  // both buffers allow it, else in 2-byte units (every dtype is a whole number of those; a
  // 16-bit row may be an odd number of them). The row size from out, so an empty source still
  // visits (and flags) every index.
  const int64_t rows = index.numel();
  const int64_t row_bytes = rows ? static_cast<int64_t>(out.nbytes()) / rows : 0;
  const int32_t* idx = index.data<int32_t>();
  const int64_t limit = src.size(0);
  DeviceFault* fault = context(out.device().index).fault;
  const bool words = row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(src.raw()) % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(out.raw()) % 4 == 0;
  if (words) {
    gather_units(static_cast<const uint32_t*>(src.raw()), idx, rows, row_bytes / 4, limit, fault,
                 static_cast<uint32_t*>(out.raw()), stream_of(out));
  } else {
    gather_units(static_cast<const uint16_t*>(src.raw()), idx, rows, row_bytes / 2, limit, fault,
                 static_cast<uint16_t*>(out.raw()), stream_of(out));
  }
}

}  // namespace accrue::cuda
