// bfloat16 products through oneDNN's matmul, for CPUs that multiply bfloat16 natively (AVX512-BF16,
// and AMX's tiles where oneDNN finds them). gemm.cpp calls it on each block of accrue's fixed cut,
// on one thread, so no bit depends on the thread count: the same role cblas_sbgemm plays for an
// OpenBLAS built with BUILD_BFLOAT16. Products of bfloat16 are exact in float32 and summed in
// float32, as the converting path's sgemm sums them, in oneDNN's order.
#pragma once

#include "core/half.h"

namespace accrue::cpu {

// Whether this build has oneDNN and the CPU multiplies bfloat16 natively. Decided once.
bool onednn_bf16_available();

// C [rows, cols] (rows ldc apart) = alpha op(A) op(B) + beta C, row-major: A stored [rows, k]
// (lda apart), or [k, rows] when trans_a; B stored [k, cols], or [cols, k] when trans_b. On this
// thread alone. Throws BackendError with oneDNN's status when a call fails, or logic_error in a
// build without oneDNN.
void onednn_bf16_gemm(bool trans_a, bool trans_b, int rows, int cols, int k, float alpha,
                      const bf16* a, int lda, const bf16* b, int ldb, float beta, float* c,
                      int ldc);

// C[i] [rows, cols] = alpha op(A[i]) op(B[i]) + beta C[i] for i in [0, batch), one matmul over a
// batch of packed matrices: A[i] stored [rows, k] (or [k, rows] when trans_a) at a + i rows k, B[i]
// stored [k, cols] (or [cols, k] when trans_b) at b + i k cols, C[i] at c + i rows cols, C float32
// or (c_bf16) bfloat16, rounded once from the float32 sums. On this thread alone; throws as
// onednn_bf16_gemm.
void onednn_bf16_gemm_batched(bool trans_a, bool trans_b, int batch, int rows, int cols, int k,
                              float alpha, const bf16* a, const bf16* b, float beta, void* c,
                              bool c_bf16);

}  // namespace accrue::cpu
