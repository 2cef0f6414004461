// The single-threaded OpenBLAS calls the CPU backend's GEMMs and convolutions make, one overload
// per element type, row-major, and the check that a size fits BLAS's int.
#pragma once

#include <cblas.h>

#include <climits>
#include <cstdint>

#include "core/error.h"

namespace accrue::cpu {

inline void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
                 const double* a, int lda, const double* b, int ldb, double beta, double* c,
                 int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// size as BLAS's int, or a ShapeError naming the op and the size.
inline int blas_int(int64_t size, const char* op, const char* what) {
  if (size < 0 || size > INT_MAX) {
    throw ShapeError(str_cat("[", op, "] ", what, " ", size, " exceeds BLAS's int range"));
  }
  return static_cast<int>(size);
}

}  // namespace accrue::cpu
