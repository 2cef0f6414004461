// CPU GEMM through OpenBLAS (cblas_sgemm / cblas_dgemm). Row-major throughout: a stored
// matrix's leading dimension is its column count, whether or not it is used transposed.
#include <cblas.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/dispatch.h"

namespace accrue::cpu {

void CpuBackend::gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
                      double beta, Tensor& c) {
  // op(a) [M, K] @ op(b) [K, N] -> c [M, N]
  const auto [m, n, k, lda, ldb] = gemm_dims(trans_a, a, b, c);
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if (m == 0 || n == 0) return;
  if (c.dtype() == DType::kFloat32) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(alpha), a.data<float>(), lda,
                b.data<float>(), ldb, static_cast<float>(beta), c.data<float>(), n);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a.data<double>(), lda, b.data<double>(), ldb,
                beta, c.data<double>(), n);
  }
}

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  // x [N, in] @ w [out, in]^T -> y [N, out], then y += bias in place
  gemm(false, true, 1.0, x, w, 0.0, y);
  if (bias.defined()) bias_add(y, bias, y);
}

}  // namespace accrue::cpu
