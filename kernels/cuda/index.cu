// CUDA indexing: gathering rows by an index (micro-batches from a shuffled on-device dataset, an
// embedding's lookup) and adding rows back by the index (an embedding's gradient), without float
// atomics: a stable sort of the positions by index and a sum over each run of equal indices; and
// permuting dimensions (attention's head split and merge), one thread per output element.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "core/cuda/check.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/dispatch.h"

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

void CudaBackend::index_add_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  // src [N, D], index [N] -> out [V, D] += src[n] at row index[n]. The positions 0..N-1 are
  // radix-sorted by their index (stable: equal indices keep increasing n), the runs of equal
  // indices found with their lengths and starts, then thread (run, column) sums its run's rows
  // in order: every output element is one thread's fixed-order sum, the same bits every time.
  const int64_t n = index.numel();
  if (n == 0) return;
  if (n > INT32_MAX) {
    throw ShapeError(str_cat("[index_add_rows] ", index.describe(), ": more than 2^31 - 1 rows"));
  }
  const int count = static_cast<int>(n);
  const int64_t d = src.numel() / n, rows = out.size(0);
  const Device device = out.device();
  const cudaStream_t stream = stream_of(out);
  const auto ints = [&](int64_t k) { return Tensor::empty({k}, DType::kInt32, device); };
  Tensor positions = ints(n), sorted_index = ints(n), sorted_positions = ints(n);
  Tensor run_index = ints(n), run_length = ints(n), run_start = ints(n), runs = ints(1);
  int32_t* p = positions.data<int32_t>();
  for_each(n, stream, [=] __device__(int64_t i) { p[i] = static_cast<int32_t>(i); });
  // The encoding writes only the first `runs` lengths, and the scan reads all n: the rest are
  // zeros, not stale memory (their starts are never used, but nothing reads uninitialised bytes).
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(run_length.raw(), 0, size_t(n) * sizeof(int32_t), stream));
  // The three CUB passes -- sort, run-length encoding, scan of the lengths -- in one temporary
  // buffer. Called with no storage, each pass only reports the bytes it needs (as CUB
  // documents); the largest sizes the buffer for the real calls.
  const int32_t* sorted = sorted_index.data<int32_t>();
  const auto passes = [&](void* storage, size_t capacity) {
    size_t need[3] = {capacity, capacity, capacity};
    ACCRUE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        storage, need[0], index.data<int32_t>(), sorted_index.data<int32_t>(), p,
        sorted_positions.data<int32_t>(), count, 0, 32, stream));
    ACCRUE_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(
        storage, need[1], sorted, run_index.data<int32_t>(), run_length.data<int32_t>(),
        runs.data<int32_t>(), count, stream));
    ACCRUE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(storage, need[2], run_length.data<int32_t>(),
                                                    run_start.data<int32_t>(), count, stream));
    return std::max(need[0], std::max(need[1], need[2]));
  };
  const size_t bytes = passes(nullptr, 0);
  Tensor storage = ints(static_cast<int64_t>(bytes / 4) + 1);
  passes(storage.raw(), bytes);
  DeviceFault* fault = context(device.index).fault;
  ACCRUE_DISPATCH_FLOATING(src.dtype(), "index_add_rows", [&] {
    const T* in = src.data<T>();
    T* o = out.data<T>();
    const int32_t *key = run_index.data<int32_t>(), *length = run_length.data<int32_t>();
    const int32_t *first = run_start.data<int32_t>(), *pos = sorted_positions.data<int32_t>();
    const int32_t* run_count = runs.data<int32_t>();
    // At most N runs; the threads of runs beyond the count found do nothing.
    for_each(n * d, stream, [=] __device__(int64_t i) {
      const int64_t run = i / d, c = i - run * d;
      if (run >= *run_count) return;
      const int32_t r = key[run];
      if (r < 0 || r >= rows) {
        if (c == 0) record_fault(fault, kScatterIndex, r, pos[first[run]], rows);
        return;
      }
      T total = 0;
      for (int32_t j = first[run]; j < first[run] + length[run]; ++j) {
        total += in[int64_t(pos[j]) * d + c];
      }
      o[int64_t(r) * d + c] += total;
    });
  });
}

namespace {

template <typename U>
void permute_units(const U* x, const fn::PermuteIndex& p, int64_t n, U* y, cudaStream_t stream) {
  for_each(n, stream, [=] __device__(int64_t j) { y[j] = x[p.source(j)]; });
}

}  // namespace

void CudaBackend::permute(const Tensor& x, const Shape& dims, Tensor& y) {
  // x [s0, s1, ...] -> y [s_dims[0], s_dims[1], ...], both contiguous, any dtype: y[j] =
  // x[source(j)] in units of the element size.
  const fn::PermuteIndex p = permute_index(x.shape(), dims);
  const int64_t n = y.numel();
  switch (dtype_size(x.dtype())) {
    case 2:
      return permute_units(static_cast<const uint16_t*>(x.raw()), p, n,
                           static_cast<uint16_t*>(y.raw()), stream_of(y));
    case 4:
      return permute_units(static_cast<const uint32_t*>(x.raw()), p, n,
                           static_cast<uint32_t*>(y.raw()), stream_of(y));
    case 8:
      return permute_units(static_cast<const uint64_t*>(x.raw()), p, n,
                           static_cast<uint64_t*>(y.raw()), stream_of(y));
    default:
      throw DTypeError(
          str_cat("[permute] no ", dtype_size(x.dtype()), "-byte elements: ", x.describe()));
  }
}

}  // namespace accrue::cuda
