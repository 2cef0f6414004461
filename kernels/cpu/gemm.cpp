// CPU GEMM through OpenBLAS (cblas_sgemm / cblas_dgemm), threaded by accrue's fixed cut
// (gemm_cut.h) so that results do not depend on the thread count. Row-major throughout: a
// stored matrix's leading dimension is its column count, whether or not it is used transposed.
//
// 16-bit operands (mixed precision) multiply in float32 with float32 accumulation, into a
// float32 C (the weight gradient into the arena, beta = 1) or a 16-bit C rounded once at the
// end. On a CPU with AVX512-BF16 or AMX, bfloat16 goes to a library that multiplies it natively
// (bf16_products.h): cblas_sbgemm from an OpenBLAS built with BUILD_BFLOAT16, else oneDNN's
// matmul (Debian's OpenBLAS 0.3.21 exports no sbgemm). Otherwise, and for float16, which has no
// BLAS call at all, each block's panels of A and B are converted to float32 into a per-thread
// scratch, exactly (every 16-bit value is a float32), and multiplied by cblas_sgemm: the same
// products, summed in another order, at the cost of one conversion pass over the panels.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/bf16_products.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/gemm_cut.h"
#include "kernels/cpu/half_product.h"
#include "kernels/cpu/onednn.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/vec.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {
namespace {

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
  for (int64_t r = 0; r < rows; ++r)
    row_to_float(src + (row0 + r) * ld + col0, dst + r * cols, cols);
}

// dst [rows, cols] (leading dimension ld) = src [rows, cols] (packed) rounded to H.
template <typename H>
void from_float_panel(const float* src, int64_t rows, int64_t cols, H* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) row_from_float(src + r * cols, dst + r * ld, cols);
}

// A thread's scratch, kept between calls: slot 0 for the panels of A and B, slot 1 for a
// float32 copy of C (half_block fills slot 0 while its caller holds slot 1).
template <typename T = float, int Slot = 0>
T* scratch(size_t count) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// The libraries that multiply bfloat16 natively, and the switch of bf16_products.h.
enum class Bf16Library { kNone, kSbgemm, kOneDnn };

std::atomic<Bf16Products>& products_choice() {
  static std::atomic<Bf16Products> choice{[] {
    const char* env = std::getenv("ACCRUE_BF16_PRODUCTS");
    return env != nullptr && std::strcmp(env, "converted") == 0 ? Bf16Products::kConverted
                                                                : Bf16Products::kNative;
  }()};
  return choice;
}

Bf16Library bf16_library() {
  if (products_choice().load() == Bf16Products::kConverted || !cpu_multiplies_bf16()) {
    return Bf16Library::kNone;
  }
#if defined(ACCRUE_HAVE_SBGEMM)
  return Bf16Library::kSbgemm;
#else
  return onednn_bf16_available() ? Bf16Library::kOneDnn : Bf16Library::kNone;
#endif
}

// Products smaller than this many multiply-adds stay on the float32 panels: there a library
// call's fixed cost outweighs its speed (measured in docs/cpu-speed.md, "bfloat16 on the matrix
// units"). A shape decides it, so the bits still do not depend on the thread count.
constexpr int64_t kNativeBf16MinMacs = int64_t{1} << 16;

// One block of C (float32, ldc apart) = alpha op(A) op(B) + beta C for bfloat16 A and B on a
// native `library`.
void native_bf16_block(Bf16Library library, bool trans_a, bool trans_b, int rows, int cols, int k,
                       float alpha, const bf16* a, int lda, const bf16* b, int ldb, float beta,
                       float* c, int ldc) {
  if (library == Bf16Library::kOneDnn) {
    onednn_bf16_gemm(trans_a, trans_b, rows, cols, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#if defined(ACCRUE_HAVE_SBGEMM)
  const auto* pa = reinterpret_cast<const bfloat16*>(a);  // OpenBLAS's uint16_t bits
  const auto* pb = reinterpret_cast<const bfloat16*>(b);
  cblas_sbgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
               trans_b ? CblasTrans : CblasNoTrans, rows, cols, k, alpha, pa, lda, pb, ldb, beta, c,
               ldc);
#else
  throw std::logic_error("cblas_sbgemm is not available in this build");
#endif
}

// The native library a whole 16-bit product of [m, k] x [k, n] runs on, or kNone for the float32
// panels: float16, a CPU or build without one, the switch, or a product too small to pay for the
// library's call.
template <typename H>
Bf16Library library_for(int m, int n, int k) {
  if constexpr (std::is_same_v<H, bf16>) {
    if (k > 0 && int64_t{m} * n * k >= kNativeBf16MinMacs) return bf16_library();
  }
  return Bf16Library::kNone;
}

// One block of C (float32, ldc apart) = alpha op(A) op(B) + beta C for 16-bit A and B, on this
// thread: on the native `library`, or with op(A) [rows, k] and op(B) [k, cols] converted to
// float32 panels (exactly) and multiplied by sgemm. A stored [rows, k] (or [k, rows] when
// trans_a), B stored [k, cols] (or [cols, k] when trans_b).
template <typename H>
void half_block(Bf16Library library, bool trans_a, bool trans_b, int rows, int cols, int k,
                float alpha, const H* a, int lda, const H* b, int ldb, float beta, float* c,
                int ldc) {
  if constexpr (std::is_same_v<H, bf16>) {
    if (library != Bf16Library::kNone) {
      native_bf16_block(library, trans_a, trans_b, rows, cols, k, alpha, a, lda, b, ldb, beta, c,
                        ldc);
      return;
    }
  }
  const size_t a_size = size_t(rows) * k, b_size = size_t(k) * cols;
  float* pa = scratch(a_size + b_size);
  float* pb = pa + a_size;
  if (trans_a) {
    to_float_panel(a, lda, 0, k, 0, rows, pa);
  } else {
    to_float_panel(a, lda, 0, rows, 0, k, pa);
  }
  if (trans_b) {
    to_float_panel(b, ldb, 0, cols, 0, k, pb);
  } else {
    to_float_panel(b, ldb, 0, k, 0, cols, pb);
  }
  // the panels' leading dimensions at least 1, as BLAS asks even when k or a size is 0
  const int lda_panel = std::max(trans_a ? rows : k, 1),
            ldb_panel = std::max(trans_b ? k : cols, 1);
  blas(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, rows, cols, k,
       alpha, pa, lda_panel, pb, ldb_panel, beta, c, ldc);
}

// C [m, n] = alpha op(A) op(B) + beta C for 16-bit A and B under accrue's cut, C being float32 or
// H (through a float32 copy of each block, rounded once at the end); then epilogue(c_block, rows,
// cols, ldc, col0) on each float32 block before it is stored.
template <typename H, typename O, typename Epilogue>
void half_gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const H* a, int lda,
               const H* b, int ldb, float beta, O* c, Epilogue epilogue) {
  const Bf16Library library = library_for<H>(m, n, k);
  cut_gemm_call(
      trans_a, trans_b, m, n, k, a, lda, b, ldb, c,
      [&](const GemmBlock<H, O>& blk) {
        if constexpr (std::is_same_v<O, float>) {
          half_block(library, trans_a, trans_b, blk.rows, blk.cols, k, alpha, blk.a, lda, blk.b,
                     ldb, beta, blk.c, n);
          epilogue(blk.c, blk.rows, blk.cols, n, blk.col0);
        } else {
          float* pc = scratch<float, 1>(size_t(blk.rows) * blk.cols);
          if (beta != 0) to_float_panel(blk.c, n, 0, blk.rows, 0, blk.cols, pc);
          half_block(library, trans_a, trans_b, blk.rows, blk.cols, k, alpha, blk.a, lda, blk.b,
                     ldb, beta, pc, blk.cols);
          epilogue(pc, blk.rows, blk.cols, blk.cols, blk.col0);
          from_float_panel(pc, blk.rows, blk.cols, blk.c, n);
        }
      },
      library == Bf16Library::kOneDnn ? CallCost::kHigh : CallCost::kLow);
}

// Whether the column blocks of C [m, n] = alpha op(A) B^T (beta 0, A not transposed: the x w^T of
// linear_forward and gemm) are computed as their transposes, B_block op(A)^T, and transposed into
// C. Where OpenBLAS's kernels make the two the same sums (blas_transposes_exactly), they run the
// transposed blocks faster at m = 32 rows, the MNIST recipes' micro-batch, in the 64-column blocks
// of its cut (a cblas harness, one thread: [32, 784] x [784, 512] 363 -> 305 us); at other row
// counts about as fast or slower, and the data gradients dy w slower in accrue-bench, so only
// this case. float32 only (the premise was measured on sgemm), so the results are those of the
// untransposed blocks on every machine.
constexpr int kTransposedRows = 32;
template <typename T>
bool blocks_transposed(bool trans_a, bool trans_b, int m, double beta, const GemmCut& cut) {
  return std::is_same_v<T, float> && m == kTransposedRows && !trans_a && trans_b && beta == 0 &&
         cut.parallel && !cut.along_rows && cut.width == kMicroBatchBlock &&
         blas_transposes_exactly();
}

// c [cols, rows] (rows ldc apart) = t^T, t [rows, cols] packed: N x N tiles transposed in vector
// registers (vec::transpose), the edges that do not fill a tile one value at a time.
template <typename T>
void transpose_into(const T* t, int rows, int cols, T* c, int ldc) {
  constexpr int N = 32 / sizeof(T);  // a tile's row: one AVX register
  const int tiled_rows = rows / N * N, tiled_cols = cols / N * N;
  for (int i = 0; i < tiled_rows; i += N) {
    for (int j = 0; j < tiled_cols; j += N) {
      vec::Vec<T, N> tile[N];
      for (int k = 0; k < N; ++k) tile[k] = vec::load<T, N>(t + int64_t{i + k} * cols + j);
      vec::transpose<T, N>(tile);
      for (int k = 0; k < N; ++k) vec::store(c + int64_t{j + k} * ldc + i, tile[k]);
    }
  }
  for (int i = 0; i < rows; ++i) {
    for (int j = i < tiled_rows ? tiled_cols : 0; j < cols; ++j) {
      c[int64_t{j} * ldc + i] = t[int64_t{i} * cols + j];
    }
  }
}

// One block of C = alpha op(A) op(B) + beta C, as written or (transposed, beta 0) as
// op(B_block)^T op(A)^T into a thread's scratch, then transposed into the block.
template <typename T>
void multiply_block(bool transposed, bool trans_a, bool trans_b, int k, T alpha, int lda, int ldb,
                    T beta, int ldc, const GemmBlock<T>& blk) {
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if (!transposed) {
    blas(ta, tb, blk.rows, blk.cols, k, alpha, blk.a, lda, blk.b, ldb, beta, blk.c, ldc);
    return;
  }
  T* t = scratch<T>(size_t(blk.rows) * blk.cols);  // C_block^T [cols, rows]
  blas(trans_b ? CblasNoTrans : CblasTrans, trans_a ? CblasNoTrans : CblasTrans, blk.cols, blk.rows,
       k, alpha, blk.b, ldb, blk.a, lda, T(0), t, blk.rows);
  transpose_into(t, blk.cols, blk.rows, blk.c, ldc);
}

// Whether a batch of bfloat16 products [m, k] x [k, n], each too small for the library on its
// own (kNativeBf16MinMacs), goes to oneDNN as batched matmuls: attention's per-head products.
// A call per matrix costs more than the products (docs/cpu-speed.md has the measurements).
bool batched_on_onednn(int64_t m, int64_t n, int64_t k) {
  return bf16_library() == Bf16Library::kOneDnn && k > 0 && m * n * k < kNativeBf16MinMacs;
}

// c [B, M, N] (bfloat16 or float32) = alpha op(a[i]) op(b[i]) + beta c[i] for bfloat16 a and b,
// packed matrices: chunks of matrices fixed by the shape, each one single-threaded matmul.
void onednn_batches(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                    float beta, Tensor& c) {
  const int64_t count = c.size(0), m = c.size(1), n = c.size(2);
  const int64_t k = trans_a ? a.size(1) : a.size(2);
  // matrices per call: about kNativeBf16MinMacs multiply-adds, a count fixed by the shape alone,
  // so which thread runs a call never changes a bit
  const int64_t per_call =
      std::max<int64_t>(1, kNativeBf16MinMacs / std::max<int64_t>(1, m * n * k));
  const int64_t calls = (count + per_call - 1) / per_call;
  const bool c_bf16 = !accumulates_in_float<bf16>("gemm_batched", c.dtype());
  const auto* pa = a.data<bf16>();
  const auto* pb = b.data<bf16>();
  auto* pc = static_cast<char*>(c.raw());
  const int64_t c_bytes = m * n * int64_t(dtype_size(c.dtype()));
  for_library_calls(calls, count * m * n * k >= kParallelMacs, [&](int64_t call) {
    const int64_t first = call * per_call, matrices = std::min(per_call, count - first);
    onednn_bf16_gemm_batched(trans_a, trans_b, int(matrices), int(m), int(n), int(k), alpha,
                             pa + first * m * k, pb + first * k * n, beta, pc + first * c_bytes,
                             c_bf16);
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
  if (is_half(a.dtype())) {
    ACCRUE_DISPATCH_FLOATING_AND_HALF(a.dtype(), "gemm", [&] {
      if constexpr (is_half_v<T>) {
        with_wide_output<T>(c, "gemm", [&](auto* out) {
          half_gemm(trans_a, trans_b, m, n, k, float(alpha), a.data<T>(), lda, b.data<T>(), ldb,
                    float(beta), out, NoEpilogue{});
        });
      }
    });
    return;
  }
  ACCRUE_DISPATCH_FLOATING(c.dtype(), "gemm", [&] {
    const bool transposed = blocks_transposed<T>(trans_a, trans_b, m, beta, cut_gemm(m, n, k));
    cut_gemm_call(trans_a, trans_b, m, n, k, a.data<T>(), lda, b.data<T>(), ldb, c.data<T>(),
                  [&](const GemmBlock<T>& blk) {
                    multiply_block(transposed, trans_a, trans_b, k, T(alpha), lda, ldb, T(beta), n,
                                   blk);
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
        half_gemm(false, true, m, n, k, 1.0f, x.data<T>(), lda, w.data<T>(), ldb, 0.0f, y.data<T>(),
                  [&](float* c, int rows, int cols, int ldc, int col0) {
                    bias_relu_block(c, rows, cols, ldc, b ? b + col0 : nullptr, relu);
                  });
      }
    });
    return;
  }
  ACCRUE_DISPATCH_FLOATING(y.dtype(), "linear_forward", [&] {
    const bool transposed = blocks_transposed<T>(false, true, m, 0.0, cut_gemm(m, n, k));
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    cut_gemm_call(false, true, m, n, k, x.data<T>(), lda, w.data<T>(), ldb, y.data<T>(),
                  [&](const GemmBlock<T>& blk) {
                    multiply_block(transposed, false, true, k, T(1), lda, ldb, T(0), n, blk);
                    bias_relu_block(blk.c, blk.rows, blk.cols, n, b ? b + blk.col0 : nullptr, relu);
                  });
  });
}

void CpuBackend::gemm_batched(bool trans_a, bool trans_b, double alpha, const Tensor& a,
                              const Tensor& b, double beta, Tensor& c) {
  // a [B, ...], b [B, ...] -> c [B, M, N]: one GEMM per matrix, each cut by its shape alone.
  // Attention's matrices are small ([T, T] and [T, D] per head), so the team shares the matrices
  // rather than cutting each one; a matrix's bits do not depend on which thread computes it.
  const int64_t count = c.size(0), k = trans_a ? a.size(1) : a.size(2);
  if (a.dtype() == DType::kBFloat16 && b.dtype() == DType::kBFloat16 &&
      batched_on_onednn(c.size(1), c.size(2), k)) {
    return onednn_batches(trans_a, trans_b, float(alpha), a, b, float(beta), c);
  }
  const auto one = [&](int64_t i) {
    Tensor ci = batch_matrix(c, i);
    gemm(trans_a, trans_b, alpha, batch_matrix(a, i), batch_matrix(b, i), beta, ci);
  };
  if (count > 1 && count * c.size(1) * c.size(2) * k >= kParallelMacs &&
      omp_get_max_threads() > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) one(i);
    return;
  }
  for (int64_t i = 0; i < count; ++i) one(i);
}

template <typename H>
void half_product(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const H* a, int lda,
                  const H* b, int ldb, float beta, float* c, int ldc) {
  half_block(library_for<H>(m, n, k), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
             ldc);
}
template void half_product(bool, bool, int, int, int, float, const bf16*, int, const bf16*, int,
                           float, float*, int);
template void half_product(bool, bool, int, int, int, float, const f16*, int, const f16*, int,
                           float, float*, int);

bool cpu_multiplies_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool native = __builtin_cpu_supports("avx512bf16");
  return native;
#else
  return false;
#endif
}

void set_bf16_products(Bf16Products products) {
  products_choice().store(products);
}

Bf16Products bf16_products() {
  return products_choice().load();
}

const char* bf16_products_library() {
  switch (bf16_library()) {
    case Bf16Library::kSbgemm:
      return "cblas_sbgemm";
    case Bf16Library::kOneDnn:
      return "oneDNN";
    case Bf16Library::kNone:
      break;
  }
  return "sgemm on float32 panels";
}

}  // namespace accrue::cpu
