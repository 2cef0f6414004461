// CPU GEMM through OpenBLAS (cblas_sgemm / cblas_dgemm). Row-major throughout: a stored
// matrix's leading dimension is its column count, whether or not it is used transposed.
//
// accrue owns the threading, not OpenBLAS: C is cut into blocks along its longer side, the cut
// depending only on the shape, and each block is one single-threaded BLAS call. OpenBLAS's own
// threading changes the summation order with the thread count (a [32, 784] x [784, 512]
// product differs in its last bits between 1 and 2 threads), so with it the weights a run
// produces would depend on --threads; with the cut fixed by the shape they never do, and the
// thread tuner (core/threads.h) may change the count mid-run without changing a single bit.
// The same cut keeps BLAS from forking inside accrue's threads (OpenBLAS's OpenMP build runs
// serially inside an active parallel region) and from oversubscribing the cores.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/dispatch.h"

namespace accrue::cpu {
namespace {

// Large products are cut into a power-of-two number of blocks (so 2, 4 or 8 threads share
// them evenly), each at least this many multiply-adds (about 40 us on one core) and this wide.
constexpr int64_t kBlockMacs = int64_t{1} << 21;
constexpr int kMinBlockWidth = 256;
// Below this many multiply-adds in all (about 5 us on one core) the blocks run on the calling
// thread: waking a second thread costs more than it saves.
constexpr int64_t kParallelMacs = int64_t{1} << 18;

struct GemmCut {
  bool along_rows;  // blocks of C's rows (else of its columns)
  int width;        // rows or columns per block; the last block may be narrower
  int count;
  bool parallel;  // worth more than one thread
};

// The cut of C [m, n] = op(A) [m, k] op(B) [k, n]; a function of the shape alone. The narrow
// cuts come from measuring OpenBLAS 0.3 on the micro-batch shapes (bench/gemm_libs.cpp): with
// m <= 32 rows, 32-column blocks run at 1.25-1.35x the rate of one call (the packed panels stay
// in L1/L2), 16 columns for m <= 64, and 32-row blocks help the weight gradient (k = micro-batch).
GemmCut cut_gemm(int m, int n, int k) {
  const int64_t macs = int64_t{m} * n * k;
  const auto blocks = [&](bool along_rows, int width) {
    const int extent = along_rows ? m : n;
    return GemmCut{along_rows, width, (extent + width - 1) / width, macs >= kParallelMacs};
  };
  if (m <= 32) return blocks(false, 32);
  if (m <= 64) return blocks(false, 16);
  if (k <= 32) return blocks(true, 32);
  const bool along_rows = m > n;
  const int extent = along_rows ? m : n;
  int count = 1;
  while (count < 8 && 2 * int64_t{count} * kBlockMacs <= macs &&
         2 * count * kMinBlockWidth <= extent) {
    count *= 2;
  }
  return blocks(along_rows, (extent + count - 1) / count);
}

void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
          const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// body(i) for each block: on the team's threads when the cut is worth it, else on this thread
// with BLAS held to one thread too (outside an active parallel region OpenBLAS would otherwise
// fork by itself).
template <typename F>
void for_blocks(const GemmCut& cut, F body) {
  const int count = cut.count;
  if (cut.parallel && count > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < count; ++i) body(i);
    return;
  }
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (int i = 0; i < count; ++i) body(i);
  omp_set_num_threads(threads);
}

}  // namespace

void CpuBackend::gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
                      double beta, Tensor& c) {
  // op(a) [M, K] @ op(b) [K, N] -> c [M, N]
  const auto [m, n, k, lda, ldb] = gemm_dims(trans_a, a, b, c);
  if (m == 0 || n == 0) return;
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  const GemmCut cut = cut_gemm(m, n, k);
  ACCRUE_DISPATCH_FLOATING(c.dtype(), "gemm", [&] {
    const T *pa = a.data<T>(), *pb = b.data<T>();
    T* pc = c.data<T>();
    for_blocks(cut, [&](int i) {
      const int begin = i * cut.width,
                width = std::min(cut.width, (cut.along_rows ? m : n) - begin);
      if (cut.along_rows) {
        // rows [begin, begin + width) of op(a) and of c; a stored [M, K], or [K, M] transposed
        const T* rows = pa + (trans_a ? begin : int64_t{begin} * lda);
        blas(ta, tb, width, n, k, T(alpha), rows, lda, pb, ldb, T(beta), pc + int64_t{begin} * n,
             n);
      } else {
        // columns [begin, begin + width) of op(b) and of c; b stored [K, N], or [N, K] transposed
        const T* cols = pb + (trans_b ? int64_t{begin} * ldb : begin);
        blas(ta, tb, m, width, k, T(alpha), pa, lda, cols, ldb, T(beta), pc + begin, n);
      }
    });
  });
}

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  // x [N, in] @ w [out, in]^T -> y [N, out], then y += bias in place
  gemm(false, true, 1.0, x, w, 0.0, y);
  if (bias.defined()) bias_add(y, bias, y);
}

}  // namespace accrue::cpu
