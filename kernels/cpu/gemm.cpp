// CPU GEMM through OpenBLAS (cblas_sgemm / cblas_dgemm), threaded by accrue's fixed cut
// (gemm_cut.h) so that results do not depend on the thread count. Row-major throughout: a
// stored matrix's leading dimension is its column count, whether or not it is used transposed.
#include <cblas.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm_cut.h"
#include "kernels/cpu/rows.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {
namespace {

void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
          const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// C [rows, cols] (row stride ldc) = act(C + bias[col0 ...]): the Linear epilogue, run on a block
// just computed, while it is in cache.
template <typename T>
void bias_relu_block(T* c, int rows, int cols, int ldc, const T* bias, bool relu) {
  for (int r = 0; r < rows; ++r) {
    T* row = c + int64_t{r} * ldc;
    if (bias != nullptr) add_row(row, bias, row, cols);
    if (relu) relu_row(row, cols);
  }
}

}  // namespace

void CpuBackend::gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
                      double beta, Tensor& c) {
  // op(a) [M, K] @ op(b) [K, N] -> c [M, N]
  const auto [m, n, k, lda, ldb] = gemm_dims(trans_a, a, b, c);
  if (m == 0 || n == 0) return;
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  ACCRUE_DISPATCH_FLOATING(c.dtype(), "gemm", [&] {
    cut_gemm_call(trans_a, trans_b, m, n, k, a.data<T>(), lda, b.data<T>(), ldb, c.data<T>(),
                  [&](const GemmBlock<T>& blk) {
                    blas(ta, tb, blk.rows, blk.cols, k, T(alpha), blk.a, lda, blk.b, ldb, T(beta),
                         blk.c, n);
                  });
  });
}

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool relu,
                                Tensor& y) {
  // x [N, in] @ w [out, in]^T -> y [N, out], then y = act(y + bias) block by block
  const auto [m, n, k, lda, ldb] = gemm_dims(false, x, w, y);
  if (m == 0 || n == 0) return;
  ACCRUE_DISPATCH_FLOATING(y.dtype(), "linear_forward", [&] {
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    cut_gemm_call(false, true, m, n, k, x.data<T>(), lda, w.data<T>(), ldb, y.data<T>(),
                  [&](const GemmBlock<T>& blk) {
                    blas(CblasNoTrans, CblasTrans, blk.rows, blk.cols, k, T(1), blk.a, lda, blk.b,
                         ldb, T(0), blk.c, n);
                    bias_relu_block(blk.c, blk.rows, blk.cols, n, b ? b + blk.col0 : nullptr, relu);
                  });
  });
}

}  // namespace accrue::cpu
