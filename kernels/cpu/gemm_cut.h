// How accrue threads a GEMM on the CPU: C is cut into blocks along one side, the cut a function
// of the shape alone, and each block is one single-threaded library call on the team's threads.
// Shared by the CPU backend (gemm.cpp) and the library comparison (bench/gemm_libs.cpp,
// bench/results/gemm-libs-*.md), which runs every candidate library under the same cut.
//
// Why accrue and not the library threads the call: OpenBLAS's own threading changes the
// summation order with the thread count (a [32, 784] x [784, 512] product differs in its last
// bits between 1 and 2 threads), so the weights a run produced would depend on --threads; with
// the cut fixed by the shape they never do, and the thread tuner (core/threads.h) may change the
// count mid-run without changing a bit. The same cut keeps the library from forking inside
// accrue's threads (OpenBLAS's OpenMP build runs serially inside an active parallel region).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>

namespace accrue::cpu {

// Large products are cut into a power-of-two number of blocks (so 2, 4 or 8 threads share
// them evenly), each at least this many multiply-adds (about 40 us on one core) and this wide.
// 128 rows still run near the library's rate, and a transformer micro-batch's [512, 128] x
// [128, 384]-class products then split four ways (at 512 they would stay one call on one
// thread: accrue-g2p ran at 7.6k tokens/s on 2 cores that way, 10.1k with 128).
constexpr int64_t kBlockMacs = int64_t{1} << 21;
constexpr int kMinBlockWidth = 128;
// Below this many multiply-adds in all (about 5 us on one core) the product is one call on the
// calling thread: waking a second thread, or a second call, costs more than it saves.
constexpr int64_t kParallelMacs = int64_t{1} << 18;

struct GemmCut {
  bool along_rows;  // blocks of C's rows (else of its columns)
  int width;        // rows or columns per block; the last block may be narrower
  int count;
  bool parallel;  // worth more than one thread
};

// The cut of C [m, n] = op(A) [m, k] op(B) [k, n]; a function of the shape alone. The narrow
// cuts come from measuring OpenBLAS 0.3 on the micro-batch shapes (bench/gemm_libs.cpp,
// bench/results/gemm-libs-*.md): with m <= 32 rows, narrow column blocks run well above the rate
// of one call (the packed panels stay in L1/L2), 16 columns for m <= 64, and row blocks help the
// weight gradient (k = micro-batch). 64 rather than 32 (columns for m <= 32, rows for k <= 32):
// on the AMD EPYC of bench/results the micro-step's weight gradients ran 8-14% faster and
// mnist_micro_step/cpu/32 5-9% (690-763 -> 630-713 us), the forward products unchanged.
constexpr int kMicroBatchBlock = 64;
// What each library call costs beside its arithmetic. oneDNN's bfloat16 matmul costs more per call
// than OpenBLAS: its micro-batch blocks are twice as wide where the side cut has room for two of
// them (narrower, one wide block would leave a thread idle). docs/cpu-speed.md has the rates.
enum class CallCost { kLow, kHigh };
inline int micro_batch_block(CallCost cost, int side) {
  return cost == CallCost::kHigh && side >= 4 * kMicroBatchBlock ? 2 * kMicroBatchBlock
                                                                 : kMicroBatchBlock;
}
inline GemmCut cut_gemm(int m, int n, int k, CallCost cost = CallCost::kLow) {
  const int64_t macs = int64_t{m} * n * k;
  const auto blocks = [&](bool along_rows, int width) {
    const int extent = along_rows ? m : n;
    return GemmCut{along_rows, width, (extent + width - 1) / width, macs >= kParallelMacs};
  };
  if (macs < kParallelMacs) return blocks(false, std::max(n, 1));  // one call: blocks only add cost
  if (m <= 32) return blocks(false, micro_batch_block(cost, n));
  if (m <= 64) return blocks(false, 16);
  if (k <= 32) return blocks(true, micro_batch_block(cost, m));
  const bool along_rows = m > n;
  const int extent = along_rows ? m : n;
  int count = 1;
  while (count < 8 && 2 * int64_t{count} * kBlockMacs <= macs &&
         2 * count * kMinBlockWidth <= extent) {
    count *= 2;
  }
  return blocks(along_rows, (extent + count - 1) / count);
}

// body(i) for i in [0, count), each a single-threaded library call: on the team's threads when
// `parallel` (the work is worth a fork), else on this thread with BLAS held to one thread too
// (outside an active parallel region OpenBLAS would otherwise fork by itself). Which thread runs
// an i never changes what it computes. A call that throws (a oneDNN failure) reaches the caller
// once the team is done, instead of ending the process from inside the parallel region; the
// thread count is restored either way.
template <typename F>
void for_library_calls(int64_t count, bool parallel, F body) {
  if (parallel && count > 1 && omp_get_max_threads() > 1) {
    std::exception_ptr failure;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
      try {
        body(i);
      } catch (...) {
#pragma omp critical(accrue_library_call_failure)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    return;
  }
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  try {
    for (int64_t i = 0; i < count; ++i) body(i);
  } catch (...) {
    omp_set_num_threads(threads);
    throw;
  }
  omp_set_num_threads(threads);
}

// body(i) for each block of the cut.
template <typename F>
void for_blocks(const GemmCut& cut, F body) {
  for_library_calls(cut.count, cut.parallel, [&](int64_t i) { body(static_cast<int>(i)); });
}

// One block of C and the operand pointers that produce it; leading dimensions are the whole's.
// C may have another element type than the operands (bfloat16 products into float32).
template <typename T, typename C = T>
struct GemmBlock {
  int rows, cols, col0;  // C [rows, cols] starting at column col0
  const T* a;            // its rows of op(A)
  const T* b;            // its columns of op(B)
  C* c;
};

// C [m, n] = op(A) [m, k] op(B) [k, n], row-major, cut as cut_gemm says: call(GemmBlock) computes
// one block (and may go on to work on it while it is in cache).
template <typename T, typename C, typename Call>
void cut_gemm_call(bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda, const T* b,
                   int ldb, C* c, Call call, CallCost cost = CallCost::kLow) {
  const GemmCut cut = cut_gemm(m, n, k, cost);
  for_blocks(cut, [&](int i) {
    const int begin = i * cut.width;
    const int width = std::min(cut.width, (cut.along_rows ? m : n) - begin);
    if (cut.along_rows) {
      // rows [begin, begin + width) of op(a) and of c; a stored [M, K], or [K, M] transposed
      call(GemmBlock<T, C>{width, n, 0, a + (trans_a ? begin : int64_t{begin} * lda), b,
                           c + int64_t{begin} * n});
    } else {
      // columns [begin, begin + width) of op(b) and of c; b stored [K, N], or [N, K] transposed
      call(GemmBlock<T, C>{m, width, begin, a, b + (trans_b ? int64_t{begin} * ldb : begin),
                           c + begin});
    }
  });
}

}  // namespace accrue::cpu
