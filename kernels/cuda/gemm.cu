// CUDA GEMM through cuBLAS. accrue is row-major and cuBLAS column-major: a row-major C = op(A)
// op(B) is the column-major C^T = op(B)^T op(A)^T, so the operands are passed swapped. beta = 1 is
// how the weight-gradient GEMM accumulates into the gradient arena in place. The Linear forward
// goes through cuBLASLt so the bias add is fused into the GEMM as an epilogue (cuBLAS where
// cuBLASLt has no algorithm). Plain GEMMs stay with cuBLAS: through cuBLASLt, with descriptors
// made per call and a heuristic query per new shape, they cost the host more
// (docs/device-path.md). 16-bit operands (bfloat16, float16) multiply with float32 compute into a
// float32 C (the weight gradient into the arena) or a 16-bit C: cublasGemmEx and cuBLASLt with
// CUBLAS_COMPUTE_32F and float32 alpha and beta; a 16-bit Linear with a bias adds it after the
// GEMM, in float32 (see gemm_then_bias).
#include <cublasLt.h>

#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"

namespace accrue::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat64:
      return CUDA_R_64F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat16:
      return CUDA_R_16F;
    default:
      throw DTypeError(str_cat("[gemm] no cuBLAS type for ", dtype_name(t)));
  }
}

// Owns cuBLASLt descriptors for the duration of one call.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address:
// arena views are 64-byte aligned and narrow() views may be aligned to a single element.
uint32_t alignment_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

void set_preference(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                    uint32_t value) {
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

// The cuBLASLt algorithm for key, from the context's cache, or found by one heuristic query
// and cached.
LtPlan cached_plan(DeviceContext& ctx, LtDescriptors& desc, const LtKey& key) {
  std::lock_guard<std::mutex> lock(ctx.mutex);
  auto it = ctx.lt_plans.find(key);
  if (it != ctx.lt_plans.end()) return it->second;
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.pref));
  const uint64_t workspace = DeviceContext::kLtWorkspaceBytes;
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  set_preference(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
  set_preference(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
  set_preference(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d);
  set_preference(desc.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d);
  // Partial sums (split-K) in the compute type, never in a 16-bit output type.
  set_preference(desc.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                 CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      ctx.cublas_lt, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, 1, &result, &found);
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) ACCRUE_CUBLAS_CHECK(status);
  LtPlan plan{};
  plan.found =
      status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  plan.algo = result.algo;
  ctx.lt_plans.emplace(key, plan);
  return plan;
}

// One column-major product D [m, n] = alpha op(A) op(B) + beta D, plus a bias over D's columns
// when bias is given. A and B are described as stored: op(A) [m, k] is A [k, m] transposed.
struct LtProduct {
  bool trans_a, trans_b;
  uint64_t m, n, k;
  int64_t lda, ldb, ldd;
  const void* a;
  const void* b;
  void* d;
  const void* bias;  // nullptr: none
  DType ab, out;     // A's and B's type, D's
};

// Runs p through one cuBLASLt call with the context's cached algorithm for its shape, types and
// alignments. False, with nothing run, when cuBLASLt has no algorithm for it, or the one its
// heuristic gave is refused at the call (then the key is marked so, and later calls go to cuBLAS
// at once).
bool lt_matmul(DeviceContext& ctx, const LtProduct& p, double alpha, double beta) {
  // float32 compute and scale for float32 and the 16-bit types, float64 for float64.
  const bool f32 = p.ab != DType::kFloat64;
  LtDescriptors desc;
  ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescCreate(
      &desc.op, f32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_64F, f32 ? CUDA_R_32F : CUDA_R_64F));
  const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  ACCRUE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  ACCRUE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (p.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                       &epilogue, sizeof(epilogue)));
    ACCRUE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &p.bias, sizeof(p.bias)));
  }
  const cudaDataType_t ab = cuda_type(p.ab), out = cuda_type(p.out);
  ACCRUE_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&desc.a, ab, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda));
  ACCRUE_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&desc.b, ab, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb));
  ACCRUE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.d, out, p.m, p.n, p.ldd));
  // One heuristic query per (shape, types, real alignments, epilogue), cached in the context.
  const LtKey key{p.m,
                  p.n,
                  p.k,
                  p.lda,
                  p.ldb,
                  p.ldd,
                  p.trans_a,
                  p.trans_b,
                  static_cast<int>(p.ab),
                  static_cast<int>(p.out),
                  alignment_of(p.a),
                  alignment_of(p.b),
                  alignment_of(p.d),
                  p.bias != nullptr ? alignment_of(p.bias) : 0u};
  const LtPlan plan = cached_plan(ctx, desc, key);
  if (!plan.found) return false;
  const float alpha32 = static_cast<float>(alpha), beta32 = static_cast<float>(beta);
  const void* al = f32 ? static_cast<const void*>(&alpha32) : &alpha;
  const void* be = f32 ? static_cast<const void*>(&beta32) : &beta;
  // The workspace is the context's own (stream order keeps consecutive GEMMs apart), so nothing
  // is allocated behind the caching allocator's back and nothing counts as an activation.
  const cublasStatus_t status = cublasLtMatmul(
      ctx.cublas_lt, desc.op, al, p.a, desc.a, p.b, desc.b, be, p.d, desc.d, p.d, desc.d,
      &plan.algo, ctx.lt_workspace, DeviceContext::kLtWorkspaceBytes, ctx.stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    std::lock_guard<std::mutex> lock(ctx.mutex);
    ctx.lt_plans[key].found = false;
    return false;
  }
  ACCRUE_CUBLAS_CHECK(status);
  return true;
}

// A GEMM and a bias add: where no cuBLASLt kernel fits the alignments, and for every 16-bit y
// with a bias, through a float32 block so y is rounded once. cuBLASLt's bias epilogue into a
// 16-bit D does not round once (up to 1.3 units of the format off float64 on an H200), and where
// the bias cancels the product that can flip the fused ReLU's mask.
void gemm_then_bias(CudaBackend& be, const Tensor& x, const Tensor& w, const Tensor& bias,
                    Tensor& y) {
  if (bias.defined() && is_half(y.dtype())) {
    Tensor wide = Tensor::empty(y.shape(), DType::kFloat32, y.device());
    Tensor wide_bias = Tensor::empty(bias.shape(), DType::kFloat32, y.device());
    be.gemm(false, true, 1.0, x, w, 0.0, wide);
    be.cast(bias, wide_bias);
    be.bias_add(wide, wide_bias, wide);
    be.cast(wide, y);
    return;
  }
  be.gemm(false, true, 1.0, x, w, 0.0, y);
  if (bias.defined()) be.bias_add(y, bias, y);
}

// y = x @ w^T + bias through one cuBLASLt call with a bias epilogue (or GEMM + bias add when no
// algorithm fits the operands' alignments, and for a 16-bit y with a bias).
void linear_bias(CudaBackend& be, const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  // Row-major y [N, out] = x [N, in] @ w [out, in]^T + bias is, column-major,
  // y^T [out, N] = w [out, in] @ x^T [in, N] + bias broadcast over columns: w is stored as a
  // column-major [in, out] matrix used transposed, x as a column-major [in, N] matrix.
  const uint64_t rows = static_cast<uint64_t>(x.size(0));
  const uint64_t in = static_cast<uint64_t>(x.size(1));
  const uint64_t out = static_cast<uint64_t>(w.size(0));
  if (rows == 0) return;
  // No input features (y is the bias) or no outputs: gemm and bias_add handle them.
  if (in == 0 || out == 0) return gemm_then_bias(be, x, w, bias, y);
  if (bias.defined() && is_half(y.dtype())) return gemm_then_bias(be, x, w, bias, y);
  // cuBLASLt's bias epilogue reads the bias with 16-byte loads: a view of the arena or a narrow()
  // may start at any element.
  if (bias.defined() && alignment_of(bias.raw()) < 16) return gemm_then_bias(be, x, w, bias, y);
  const LtProduct product{true,
                          false,
                          out,
                          rows,
                          in,
                          static_cast<int64_t>(in),
                          static_cast<int64_t>(in),
                          static_cast<int64_t>(out),
                          w.raw(),
                          x.raw(),
                          y.raw(),
                          bias.defined() ? bias.raw() : nullptr,
                          x.dtype(),
                          y.dtype()};
  if (!lt_matmul(context(y.device().index), product, 1.0, 0.0)) gemm_then_bias(be, x, w, bias, y);
}

}  // namespace

void CudaBackend::gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b,
                       double beta, Tensor& c) {
  // op(a) [M, K] @ op(b) [K, N] -> c [M, N]
  const auto [m, n, k, lda, ldb] = gemm_dims(trans_a, a, b, c);
  if (m == 0 || n == 0) return;
  // Column-major, c^T [n, m] = op(b)^T op(a)^T: b is cuBLAS's A and a its B.
  cublasHandle_t handle = context(c.device().index).cublas;
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (is_half(a.dtype())) {
    // 16-bit A and B, float32 compute, C float32 (beta = 1 into the arena) or 16-bit.
    if (b.dtype() != a.dtype()) {
      throw DTypeError(
          str_cat("[gemm] operands are ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype())));
    }
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    const cudaDataType_t ab = cuda_type(a.dtype());
    ACCRUE_CUBLAS_CHECK(cublasGemmEx(handle, tb, ta, n, m, k, &al, b.raw(), ab, ldb, a.raw(), ab,
                                     lda, &be, c.raw(), cuda_type(c.dtype()), n, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
  } else if (c.dtype() == DType::kFloat32) {
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    ACCRUE_CUBLAS_CHECK(cublasSgemm(handle, tb, ta, n, m, k, &al, b.data<float>(), ldb,
                                    a.data<float>(), lda, &be, c.data<float>(), n));
  } else {
    ACCRUE_CUBLAS_CHECK(cublasDgemm(handle, tb, ta, n, m, k, &alpha, b.data<double>(), ldb,
                                    a.data<double>(), lda, &beta, c.data<double>(), n));
  }
}

void CudaBackend::gemm_batched(bool trans_a, bool trans_b, double alpha, const Tensor& a,
                               const Tensor& b, double beta, Tensor& c) {
  // a [B, ...], b [B, ...] -> c [B, M, N], matrix i from matrices i: one strided-batched call
  // (row-major, so cuBLAS computes c^T = op(b)^T op(a)^T as in gemm above). Strides are whole
  // matrices; float32 keeps CUBLAS_COMPUTE_32F (no TF32), as cublasSgemm does by default.
  const int64_t batch = c.size(0);
  if (batch == 0) return;
  const Tensor a0 = batch_matrix(a, 0), b0 = batch_matrix(b, 0), c0 = batch_matrix(c, 0);
  const auto [m, n, k, lda, ldb] = gemm_dims(trans_a, a0, b0, c0);
  if (m == 0 || n == 0) return;
  cublasHandle_t handle = context(c.device().index).cublas;
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const long long stride_a = a0.numel(), stride_b = b0.numel(), stride_c = c0.numel();
  if (b.dtype() != a.dtype()) {
    throw DTypeError(str_cat("[gemm_batched] operands are ", dtype_name(a.dtype()), " and ",
                             dtype_name(b.dtype())));
  }
  const cudaDataType_t ab = cuda_type(a.dtype()), cd = cuda_type(c.dtype());
  if (a.dtype() == DType::kFloat64) {
    ACCRUE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle, tb, ta, n, m, k, &alpha, b.raw(), ab, ldb, stride_b, a.raw(), ab, lda, stride_a,
        &beta, c.raw(), cd, n, stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_64F,
        CUBLAS_GEMM_DEFAULT));
  } else {
    // float32, or 16-bit operands with float32 compute (C float32 or 16-bit)
    const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
    ACCRUE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle, tb, ta, n, m, k, &al, b.raw(), ab, ldb, stride_b, a.raw(), ab, lda, stride_a, &be,
        c.raw(), cd, n, stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }
}

void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool relu,
                                 Tensor& y) {
  linear_bias(*this, x, w, bias, y);
  // cuBLASLt's RELU_BIAS epilogue is not documented to keep NaN, and accrue's ReLU does (as
  // PyTorch's): the activation is the shared functor, in place, one more pass over y.
  if (relu) unary(UnaryOp::kRelu, y, y);
}

// relu_bias_backward, the fused Linear + ReLU's backward half, is a column sum: reduce.cu.

}  // namespace accrue::cuda
