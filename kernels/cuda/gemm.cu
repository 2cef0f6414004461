// CUDA GEMM through cuBLAS. accrue is row-major and cuBLAS column-major: a row-major C = op(A)
// op(B) is the column-major C^T = op(B)^T op(A)^T, so the operands are passed swapped. beta = 1
// is how the weight-gradient GEMM accumulates into the gradient arena in place.
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"

namespace accrue::cuda {

void CudaBackend::gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
                       double beta, Tensor& c) {
  // op(a) [M, K] @ op(b) [K, N] -> c [M, N]
  const auto [m, n, k, lda, ldb] = gemm_dims(trans_a, a, b, c);
  if (m == 0 || n == 0) return;
  cublasHandle_t handle = context(c.device().index).cublas;
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (c.dtype() == DType::kFloat32) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    ACCRUE_CUBLAS_CHECK(cublasSgemm(handle, tb, ta, n, m, k, &al, b.data<float>(), ldb,
                                    a.data<float>(), lda, &be, c.data<float>(), n));
  } else {
    ACCRUE_CUBLAS_CHECK(cublasDgemm(handle, tb, ta, n, m, k, &alpha, b.data<double>(), ldb,
                                    a.data<double>(), lda, &beta, c.data<double>(), n));
  }
}

}  // namespace accrue::cuda
