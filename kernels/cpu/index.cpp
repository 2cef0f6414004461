// CPU indexing: gathering rows by an index (micro-batches from a shuffled dataset, an
// embedding's lookup) and its backward, adding rows back by the index (an embedding's gradient);
// permuting dimensions (attention's head split and merge).
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"

namespace accrue::cpu {

void CpuBackend::gather_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  // src [N, D], index [M] -> out [M, D], rows copied whole
  const int64_t rows = index.numel();
  const size_t row_bytes = src.size(0) ? src.nbytes() / static_cast<size_t>(src.size(0)) : 0;
  const int32_t* idx = index.data<int32_t>();
  const char* in = static_cast<const char*>(src.raw());
  char* o = static_cast<char*>(out.raw());
  // The rows are scattered over a dataset that is mostly out of cache (a training batch's
  // images), so the copy waits on memory latency rather than bandwidth: each copy first asks for
  // the next row's lines, which then arrive while this row is copied (about 20% off the MLP's
  // gather; asking further ahead gained nothing more), and the work is counted in bytes, not
  // elements, so that a micro-batch of images (32 x 3 KiB) already splits over the threads, each
  // with its own requests in flight.
  for_range(rows, rows * int64_t(row_bytes), [=](int64_t m) {
    if (m + 1 < rows) {
      const char* next = in + idx[m + 1] * row_bytes;
      for (size_t at = 0; at < row_bytes; at += 64) __builtin_prefetch(next + at);
    }
    std::memcpy(o + m * row_bytes, in + idx[m] * row_bytes, row_bytes);
  });
}

void CpuBackend::index_add_rows(const Tensor& src, const Tensor& index, Tensor& out) {
  // src [N, D], index [N] -> out [V, D] += src[n] at row index[n]. The positions are bucketed by
  // their row (a stable counting sort), then the rows are summed in parallel, each over its
  // positions in increasing n: the same bits for any number of threads.
  ACCRUE_DISPATCH_FLOATING(src.dtype(), "index_add_rows", [&] {
    const int64_t n = index.numel(), rows = out.size(0);
    const int64_t d = n ? src.numel() / n : 0;
    const int32_t* idx = index.data<int32_t>();
    std::vector<int64_t> start(static_cast<size_t>(rows + 1), 0), order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ++start[static_cast<size_t>(idx[i]) + 1];
    for (int64_t r = 0; r < rows; ++r) start[r + 1] += start[r];
    std::vector<int64_t> cursor(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(cursor[idx[i]]++)] = i;
    const T* in = src.data<T>();
    T* o = out.data<T>();
    const int64_t* first = start.data();
    const int64_t* pos = order.data();
    for_range(rows, n * d, [=](int64_t r) {
      if (first[r] == first[r + 1]) return;
      for (int64_t c = 0; c < d; ++c) {  // as the CUDA kernel: the run's sum, then one add
        T total = 0;
        for (int64_t j = first[r]; j < first[r + 1]; ++j) total += in[pos[j] * d + c];
        o[r * d + c] += total;
      }
    });
  });
}

namespace {

// Elements of y per task of permute_units (whole runs: at least one run).
constexpr int64_t kPermuteBlock = 8192;

// y = x permuted, in elements of U. When the last dimension stays last, whole runs of it are
// copied; otherwise element by element. A block of runs (about kPermuteBlock elements) finds its
// first run's place in x by division (fn::PermuteIndex::source), then steps y's coordinates like
// an odometer: a division per dimension for every run costs more than copying a run of 32 values.
template <typename U>
void permute_units(const U* x, const fn::PermuteIndex& p, int64_t n, U* y) {
  const int last = p.rank - 1;
  const bool runs_of_last = p.rank > 0 && p.in_stride[last] == 1;
  const int64_t run = runs_of_last ? p.size[last] : 1;
  const int64_t runs = run ? n / run : 0;
  const int outer = runs_of_last ? last : p.rank;  // y's dimensions that number the runs
  const int64_t per_block = std::max<int64_t>(1, kPermuteBlock / std::max<int64_t>(run, 1));
  for_range((runs + per_block - 1) / per_block, n, [=](int64_t block) {
    const int64_t first = block * per_block, end = std::min(runs, first + per_block);
    int64_t at[fn::PermuteIndex::kMaxDims] = {};  // run `first`'s coordinates in y
    for (int64_t d = outer - 1, j = first; d >= 0; --d) {
      at[d] = j % p.size[d];
      j /= p.size[d];
    }
    int64_t from = p.source(first * run);
    for (int64_t r = first; r < end; ++r) {
      std::memcpy(y + r * run, x + from, static_cast<size_t>(run) * sizeof(U));
      for (int d = outer - 1; d >= 0; --d) {  // the next run: carry through full dimensions
        from += p.in_stride[d];
        if (++at[d] < p.size[d]) break;
        from -= at[d] * p.in_stride[d];
        at[d] = 0;
      }
    }
  });
}

}  // namespace

void CpuBackend::permute(const Tensor& x, const Shape& dims, Tensor& y) {
  // x [s0, s1, ...] -> y [s_dims[0], s_dims[1], ...], both contiguous, any dtype.
  const fn::PermuteIndex p = permute_index(x.shape(), dims);
  switch (dtype_size(x.dtype())) {
    case 2:
      return permute_units(static_cast<const uint16_t*>(x.raw()), p, y.numel(),
                           static_cast<uint16_t*>(y.raw()));
    case 4:
      return permute_units(static_cast<const uint32_t*>(x.raw()), p, y.numel(),
                           static_cast<uint32_t*>(y.raw()));
    case 8:
      return permute_units(static_cast<const uint64_t*>(x.raw()), p, y.numel(),
                           static_cast<uint64_t*>(y.raw()));
    default:
      throw DTypeError(
          str_cat("[permute] no ", dtype_size(x.dtype()), "-byte elements: ", x.describe()));
  }
}

}  // namespace accrue::cpu
