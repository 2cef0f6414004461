// One 16-bit matrix product on the calling thread, for kernels that cut their work themselves (the
// 16-bit convolution: one product per sample or per chunk of samples, conv_half.cpp). It is the
// per-block call of gemm.cpp's 16-bit GEMM: bfloat16 on the library that multiplies it natively
// where this CPU and build have one and the product is large enough to pay for the call
// (bf16_products.h), else float32 copies of the operands multiplied by sgemm. Either way the exact
// float32 products are summed in float32, and nothing depends on the thread count.
#pragma once

namespace accrue::cpu {

// C [m, n] (float32, rows ldc apart) = alpha op(A) op(B) + beta C, row-major, H being bf16 or f16:
// A stored [m, k] (lda apart), or [k, m] when trans_a; B stored [k, n], or [n, k] when trans_b.
template <typename H>
void half_product(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const H* a, int lda,
                  const H* b, int ldb, float beta, float* c, int ldc);

}  // namespace accrue::cpu
