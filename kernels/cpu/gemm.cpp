// CPU GEMM through OpenBLAS (cblas_sgemm / cblas_dgemm), threaded by accrue's fixed cut
// (gemm_cut.h) so that results do not depend on the thread count. Row-major throughout: a
// stored matrix's leading dimension is its column count, whether or not it is used transposed.
//
// 16-bit operands (mixed precision) multiply in float32 with float32 accumulation, into a
// float32 C (the weight gradient into the arena, beta = 1) or a 16-bit C rounded once at the
// end. With an OpenBLAS built with BUILD_BFLOAT16 on a CPU with AVX512-BF16 or AMX, bfloat16
// goes to cblas_sbgemm; otherwise (Debian's OpenBLAS 0.3.21 exports no sbgemm, and float16 has
// no BLAS call at all) each block's panels of A and B are converted to float32 into a per-thread
// scratch, exactly (every 16-bit value is a float32), and multiplied by cblas_sgemm: the same
// products and sums as a native call, at the cost of one conversion pass over the panels.
#include <cblas.h>

#include <vector>

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
template <typename T, typename B>
void bias_relu_block(T* c, int rows, int cols, int ldc, const B* bias, bool relu) {
  for (int r = 0; r < rows; ++r) {
    T* row = c + int64_t{r} * ldc;
    if (bias != nullptr) add_row(row, bias, row, cols);
    if (relu) relu_row(row, cols);
  }
}

// dst [rows, cols] (packed) = src [row0 .., col0 ..] of a matrix with leading dimension ld.
template <typename H>
void to_float_panel(const H* src, int64_t ld, int64_t row0, int64_t rows, int64_t col0,
                    int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const H* in = src + (row0 + r) * ld + col0;
    float* out = dst + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] = load(in[c]);
  }
}

// A thread's float32 scratch for the panels of one block (kept between calls).
float* scratch(size_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

// C [m, n] = alpha op(A) op(B) + beta C for 16-bit A and B, C being float32 or H; then
// epilogue(c_block, rows, cols, ldc, col0) on each float32 block before it is stored.
template <typename H, typename O, typename Epilogue>
void half_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const H* a, int lda,
               const H* b, int ldb, float beta, O* c, Epilogue epilogue) {
  const GemmCut cut = cut_gemm(m, n, k);
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  for_blocks(cut, [&](int i) {
    const int begin = i * cut.width;
    const int width = std::min(cut.width, (cut.along_rows ? m : n) - begin);
    const int row0 = cut.along_rows ? begin : 0, rows = cut.along_rows ? width : m;
    const int col0 = cut.along_rows ? 0 : begin, cols = cut.along_rows ? n : width;
    const bool float_c = std::is_same_v<O, float>;
    const size_t a_size = size_t(rows) * k, b_size = size_t(k) * cols;
    float* pa = scratch(a_size + b_size + (float_c ? 0 : size_t(rows) * cols));
    float* pb = pa + a_size;
    // op(A) rows [row0, +rows): A stored [M, K], or [K, M] when transposed
    if (trans_a) {
      to_float_panel(a, lda, 0, k, row0, rows, pa);
    } else {
      to_float_panel(a, lda, row0, rows, 0, k, pa);
    }
    // op(B) columns [col0, +cols): B stored [K, N], or [N, K] when transposed
    if (trans_b) {
      to_float_panel(b, ldb, col0, cols, 0, k, pb);
    } else {
      to_float_panel(b, ldb, 0, k, col0, cols, pb);
    }
    O* cb = c + int64_t{row0} * n + col0;
    if constexpr (std::is_same_v<O, float>) {
      blas(ta, tb, rows, cols, k, alpha, pa, trans_a ? rows : k, pb, trans_b ? k : cols, beta, cb,
           n);
      epilogue(cb, rows, cols, n, col0);
    } else {
      float* pc = pb + b_size;
      if (beta != 0) to_float_panel(cb, n, 0, rows, 0, cols, pc);
      blas(ta, tb, rows, cols, k, alpha, pa, trans_a ? rows : k, pb, trans_b ? k : cols, beta, pc,
           cols);
      epilogue(pc, rows, cols, cols, col0);
      for (int r = 0; r < rows; ++r) {
        for (int j = 0; j < cols; ++j) cb[int64_t{r} * n + j] = store<O>(pc[int64_t{r} * cols + j]);
      }
    }
  });
}

struct NoEpilogue {
  void operator()(float*, int, int, int, int) const {}
};

}  // namespace

void CpuBackend::gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
                      double beta, Tensor& c) {
  // op(a) [M, K] @ op(b) [K, N] -> c [M, N]
  const auto [m, n, k, lda, ldb] = gemm_dims(trans_a, a, b, c);
  if (m == 0 || n == 0) return;
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if (is_half(a.dtype())) {
    ACCRUE_DISPATCH_FLOATING_AND_HALF(a.dtype(), "gemm", [&] {
      if constexpr (is_half_v<T>) {
        with_accumulator<T>(c, "gemm", [&](auto* out) {
          half_gemm(trans_a, trans_b, m, n, k, float(alpha), a.data<T>(), lda, b.data<T>(), ldb,
                    float(beta), out, NoEpilogue{});
        });
      }
    });
    return;
  }
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
  if (is_half(y.dtype())) {
    ACCRUE_DISPATCH_FLOATING_AND_HALF(y.dtype(), "linear_forward", [&] {
      if constexpr (is_half_v<T>) {
        const T* b = bias.defined() ? bias.data<T>() : nullptr;
        half_gemm(false, true, m, n, k, 1.0f, x.data<T>(), lda, w.data<T>(), ldb, 0.0f,
                  y.data<T>(), [&](float* c, int rows, int cols, int ldc, int col0) {
                    bias_relu_block(c, rows, cols, ldc, b ? b + col0 : nullptr, relu);
                  });
      }
    });
    return;
  }
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
