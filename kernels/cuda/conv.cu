// CUDA convolution through cuDNN 9's convolution API (cudnnConvolutionForward, BackwardData,
// BackwardFilter, BackwardBias), NCHW, groups 1, on the device's stream. The filter and bias
// gradients accumulate into the gradient arena through beta = 1; the float32 and float64 filter
// gradient is one GEMM over the unfolded patches where they fit (lowered_filter_gradient). For each
// shape the algorithms are chosen once by cuDNN's heuristics (the first that fits the workspace
// limit and keeps the data type's precision, see first_usable) and cached with their math types and
// workspace sizes; the workspace comes from the caching allocator, so it is counted and reused
// like any tensor. Errors throw with cudnnGetErrorString and file:line. Built only where cuDNN
// was found (ACCRUE_WITH_CUDNN); otherwise the three primitives throw and
// cuda_conv_unavailable_reason() says "built without cuDNN".
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda_seam.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

#if defined(ACCRUE_WITH_CUDNN)
#include <cudnn.h>

#define ACCRUE_CUDNN_CHECK(call)                                                                 \
  do {                                                                                           \
    const cudnnStatus_t accrue_status_ = (call);                                                 \
    if (accrue_status_ != CUDNN_STATUS_SUCCESS) {                                                \
      throw ::accrue::BackendError(                                                              \
          ::accrue::str_cat("[cudnn] ", #call, " failed: ", cudnnGetErrorString(accrue_status_), \
                            " at ", __FILE__, ":", __LINE__));                                   \
    }                                                                                            \
  } while (0)
#endif

namespace accrue::cuda {

#if defined(ACCRUE_WITH_CUDNN)

namespace {

// Workspaces above this are not considered (cuDNN may otherwise ask for gigabytes).
constexpr size_t kMaxWorkspace = size_t{256} << 20;

// One convolution's shape: the cache key.
struct ConvKey {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw;
  int dtype;
  auto tie() const { return std::tie(n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, dtype); }
  bool operator<(const ConvKey& other) const { return tie() < other.tie(); }
};

// Each pass's algorithm with the math type cuDNN ranked it under: the descriptor must carry that
// math type when the pass runs (cuDNN picks the kernel from the algorithm and the math type).
struct ConvPlan {
  cudnnConvolutionFwdAlgo_t forward;
  cudnnConvolutionBwdDataAlgo_t backward_data;
  cudnnConvolutionBwdFilterAlgo_t backward_filter;
  cudnnMathType_t forward_math, data_math, filter_math;
  size_t forward_bytes, data_bytes, filter_bytes;
};

// Per device: the cuDNN handle (on the device's stream) and the plans.
struct CudnnState {
  cudnnHandle_t handle = nullptr;
  std::map<ConvKey, ConvPlan> plans;
};
std::mutex cudnn_mutex;
std::map<int, CudnnState> cudnn_states;  // never destroyed: handles live as long as the process

// The descriptors of one call, destroyed when it returns.
struct ConvDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  ~ConvDescriptors() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

cudnnDataType_t cudnn_type(DType t) {
  if (t == DType::kFloat32) return CUDNN_DATA_FLOAT;
  if (t == DType::kFloat64) return CUDNN_DATA_DOUBLE;
  throw DTypeError(str_cat("[conv2d] expects float32 or float64, got ", dtype_name(t)));
}

int as_int(int64_t v) {
  if (v > INT32_MAX) throw ShapeError(str_cat("[conv2d] dimension ", v, " exceeds cuDNN's int"));
  return static_cast<int>(v);
}

// Everything a call needs: handle, descriptors, plan (found once per shape).
struct ConvCall {
  cudnnHandle_t handle;
  ConvDescriptors d;
  ConvPlan plan;
  cudnnDataType_t type;
};

// The FFT and Winograd algorithms of each pass: they transform the data and round in the
// transform, and their float32 error can exceed the 2e-5 the CPU parity tables allow.
bool transform_based(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool transform_based(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// The math type the descriptor carries while cuDNN ranks the algorithms. float32: FMA, so that
// no candidate is a TF32 tensor-core kernel (CUDNN_DEFAULT_MATH permits TF32 on Ampere and
// later; the CPU parity tables expect float32). float64: cuDNN's default; TF32 concerns float32
// data only, and cuDNN may report double's algorithms with the default math type.
cudnnMathType_t ranking_math(cudnnDataType_t type) {
  return type == CUDNN_DATA_FLOAT ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

// Whether a candidate keeps the data type's precision. float32: FMA math only, and no FFT or
// Winograd algorithm. float64: any math type but the tensor-op ones (FMA or default).
template <typename Perf>
bool keeps_precision(const Perf& p, cudnnDataType_t type) {
  if (type == CUDNN_DATA_FLOAT) return p.mathType == CUDNN_FMA_MATH && !transform_based(p.algo);
  return p.mathType != CUDNN_TENSOR_OP_MATH && p.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// The first of cuDNN's ranked candidates that succeeded within the workspace limit and keeps the
// precision (the workspace size reported is that of the candidate's math type), preferring
// deterministic ones: some backward algorithms sum with atomics, and accrue's results repeat to
// the bit. A non-deterministic one is taken only when no deterministic one is offered.
template <typename Perf>
const Perf& first_usable(const std::vector<Perf>& perf, int found, cudnnDataType_t type,
                         const char* pass) {
  for (bool deterministic : {true, false}) {
    for (int i = 0; i < found; ++i) {
      const Perf& p = perf[i];
      if (p.status == CUDNN_STATUS_SUCCESS && p.memory <= kMaxWorkspace &&
          keeps_precision(p, type) && (!deterministic || p.determinism == CUDNN_DETERMINISTIC)) {
        return p;
      }
    }
  }
  throw BackendError(str_cat("[conv2d] cuDNN offers no ", pass, " algorithm for this shape ",
                             type == CUDNN_DATA_FLOAT
                                 ? "in float32 with FMA math and without FFT or Winograd"
                                 : "in float64 without tensor-op math",
                             " (", found, " candidates ranked)"));
}

void describe(ConvCall& call, const Tensor& x, const Tensor& w, const Tensor& y,
              const Conv2dGeometry& g) {
  const cudnnDataType_t type = cudnn_type(x.dtype());
  call.type = type;
  ACCRUE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&call.d.x));
  ACCRUE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&call.d.y));
  ACCRUE_CUDNN_CHECK(cudnnCreateTensorDescriptor(&call.d.bias));
  ACCRUE_CUDNN_CHECK(cudnnCreateFilterDescriptor(&call.d.w));
  ACCRUE_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&call.d.conv));
  ACCRUE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(call.d.x, CUDNN_TENSOR_NCHW, type,
                                                as_int(x.size(0)), as_int(x.size(1)),
                                                as_int(x.size(2)), as_int(x.size(3))));
  ACCRUE_CUDNN_CHECK(cudnnSetTensor4dDescriptor(call.d.y, CUDNN_TENSOR_NCHW, type,
                                                as_int(y.size(0)), as_int(y.size(1)),
                                                as_int(y.size(2)), as_int(y.size(3))));
  ACCRUE_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(call.d.bias, CUDNN_TENSOR_NCHW, type, 1, as_int(w.size(0)), 1, 1));
  ACCRUE_CUDNN_CHECK(cudnnSetFilter4dDescriptor(call.d.w, type, CUDNN_TENSOR_NCHW,
                                                as_int(w.size(0)), as_int(w.size(1)),
                                                as_int(w.size(2)), as_int(w.size(3))));
  // Cross-correlation, as every framework's "convolution"; math in the data type.
  ACCRUE_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      call.d.conv, as_int(g.pad_h), as_int(g.pad_w), as_int(g.stride_h), as_int(g.stride_w),
      as_int(g.dilation_h), as_int(g.dilation_w), CUDNN_CROSS_CORRELATION, type));
  // For the ranking; each pass sets its own algorithm's math type before it runs (run_math).
  ACCRUE_CUDNN_CHECK(cudnnSetConvolutionMathType(call.d.conv, ranking_math(type)));

  const int device = x.device().index;
  DeviceContext& ctx = context(device);  // makes the device current: the handle belongs to it
  std::lock_guard<std::mutex> lock(cudnn_mutex);
  CudnnState& state = cudnn_states[device];
  if (state.handle == nullptr) ACCRUE_CUDNN_CHECK(cudnnCreate(&state.handle));
  ACCRUE_CUDNN_CHECK(cudnnSetStream(state.handle, ctx.stream));
  call.handle = state.handle;
  const ConvKey key{x.size(0),    x.size(1),
                    x.size(2),    x.size(3),
                    w.size(0),    w.size(2),
                    w.size(3),    g.stride_h,
                    g.stride_w,   g.pad_h,
                    g.pad_w,      g.dilation_h,
                    g.dilation_w, static_cast<int>(x.dtype())};
  const auto it = state.plans.find(key);
  if (it != state.plans.end()) {
    call.plan = it->second;
    return;
  }
  // cuDNN's heuristics rank every algorithm (in each math type cuDNN offers it for); take the
  // first usable one. The arrays hold as many candidates as cuDNN can return.
  int most = 0, found = 0;
  ConvPlan plan{};
  {
    ACCRUE_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(state.handle, &most));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(most));
    ACCRUE_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
        state.handle, call.d.x, call.d.w, call.d.conv, call.d.y, most, &found, perf.data()));
    const auto& best = first_usable(perf, found, type, "forward");
    plan.forward = best.algo;
    plan.forward_math = best.mathType;
    plan.forward_bytes = best.memory;
  }
  {
    ACCRUE_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(state.handle, &most));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(most));
    ACCRUE_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        state.handle, call.d.w, call.d.y, call.d.conv, call.d.x, most, &found, perf.data()));
    const auto& best = first_usable(perf, found, type, "backward-data");
    plan.backward_data = best.algo;
    plan.data_math = best.mathType;
    plan.data_bytes = best.memory;
  }
  {
    ACCRUE_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(state.handle, &most));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(most));
    ACCRUE_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        state.handle, call.d.x, call.d.y, call.d.conv, call.d.w, most, &found, perf.data()));
    const auto& best = first_usable(perf, found, type, "backward-filter");
    plan.backward_filter = best.algo;
    plan.filter_math = best.mathType;
    plan.filter_bytes = best.memory;
  }
  state.plans.emplace(key, plan);
  call.plan = plan;
}

// Before a pass runs, the descriptor takes the math type its algorithm was ranked under: cuDNN
// runs the kernel that the pair (algorithm, math type) names, with that pair's workspace size.
void run_math(ConvCall& call, cudnnMathType_t math) {
  ACCRUE_CUDNN_CHECK(cudnnSetConvolutionMathType(call.d.conv, math));
}

// A workspace of at least `bytes` from the caching allocator (undefined for 0 bytes).
Tensor workspace(size_t bytes, Device device) {
  if (bytes == 0) return Tensor();
  return Tensor::empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::kFloat32, device);
}

// cuDNN's alpha and beta: double for double data, float otherwise.
struct Scalars {
  float f[2];
  double d[2];
  const void* alpha(cudnnDataType_t t) const {
    return t == CUDNN_DATA_DOUBLE ? (const void*)&d[0] : &f[0];
  }
  const void* beta(cudnnDataType_t t) const {
    return t == CUDNN_DATA_DOUBLE ? (const void*)&d[1] : &f[1];
  }
};
Scalars scalars(double alpha, double beta) {
  return {{static_cast<float>(alpha), static_cast<float>(beta)}, {alpha, beta}};
}

void* raw_or_null(const Tensor& t) {
  return t.defined() ? t.raw() : nullptr;
}

// The filter gradient's lowering is used while its two matrices take at most this; past it,
// cuDNN's own algorithm.
constexpr size_t kLoweredFilterBytes = size_t{64} << 20;

// x [N, C, H, W] -> cols [N OH OW, C KH KW] by fn::LoweredFilterIndex (whose index math the CPU
// tests check).
template <typename T>
void unfold_patches(const Tensor& x, const fn::LoweredFilterIndex& index, Tensor& cols) {
  const T* xs = x.data<T>();
  T* patches = cols.data<T>();
  const fn::LoweredFilterIndex k = index;
  for_each(cols.numel(), stream_of(cols), [=] __device__(int64_t i) {
    const int from = k.patch_source(static_cast<int>(i));
    patches[i] = from >= 0 ? xs[from] : T(0);
  });
}

// dw [OC, C KH KW] = beta dw + rows^T [OC, N OH OW] cols [N OH OW, C KH KW], rows being dy
// [N, OC, OH OW] permuted to [N, OH OW, OC]: the whole batch's filter gradient as one GEMM, whose
// long inner dimension cuBLASLt splits and sums in the compute type, in a fixed order, where
// cuDNN's deterministic algorithm is slow at small channel counts (docs/device-path.md). float32
// and float64 only, with the two matrices within kLoweredFilterBytes and x of fewer than 2^31
// elements; false (nothing done) otherwise, and cuDNN's algorithm runs.
bool lowered_filter_gradient(CudaBackend& be, const Tensor& dy, const Tensor& x,
                             const Conv2dGeometry& g, double beta, Tensor& dw) {
  const DType type = x.dtype();
  if ((type != DType::kFloat32 && type != DType::kFloat64) || dy.dtype() != type ||
      dw.dtype() != type) {
    return false;
  }
  const int64_t out_channels = dw.size(0), kh = dw.size(2), kw = dw.size(3);
  const int64_t oh = dy.size(2), ow = dy.size(3);
  const int64_t rows = x.size(0) * oh * ow, patch = dw.size(1) * kh * kw;
  if (rows == 0 || out_channels == 0 || patch == 0) return false;
  const double bytes = static_cast<double>(rows) * static_cast<double>(patch + out_channels) *
                       static_cast<double>(dtype_size(type));
  if (bytes > static_cast<double>(kLoweredFilterBytes) || x.numel() >= (int64_t{1} << 31)) {
    return false;
  }
  const fn::LoweredFilterIndex index =
      fn::LoweredFilterIndex::of(x.size(1), x.size(2), x.size(3), kh, kw, oh, ow, g);
  Tensor cols = Tensor::empty({rows, patch}, type, x.device());
  ACCRUE_DISPATCH_FLOATING(type, "conv2d_backward_filter",
                           [&] { unfold_patches<T>(x, index, cols); });
  const int64_t n = x.size(0);
  Tensor dy_rows = Tensor::empty({rows, out_channels}, type, x.device());
  Tensor permuted = dy_rows.view({n, oh * ow, out_channels});
  be.permute(dy.view({n, out_channels, oh * ow}), {0, 2, 1}, permuted);
  Tensor dw_matrix = dw.view({out_channels, patch});
  be.gemm(true, false, 1.0, dy_rows, cols, beta, dw_matrix);
  return true;
}

}  // namespace

void CudaBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 const Conv2dGeometry& g, Tensor& y) {
  // x [N, C, H, W] * w [O, C, KH, KW] -> y [N, O, OH, OW], then y += bias over N, OH, OW
  ConvCall call;
  describe(call, x, w, y, g);
  run_math(call, call.plan.forward_math);
  Tensor ws = workspace(call.plan.forward_bytes, x.device());
  const Scalars zero_beta = scalars(1.0, 0.0), one_beta = scalars(1.0, 1.0);
  ACCRUE_CUDNN_CHECK(cudnnConvolutionForward(
      call.handle, zero_beta.alpha(call.type), call.d.x, x.raw(), call.d.w, w.raw(), call.d.conv,
      call.plan.forward, raw_or_null(ws), call.plan.forward_bytes, zero_beta.beta(call.type),
      call.d.y, y.raw()));
  if (bias.defined()) {
    ACCRUE_CUDNN_CHECK(cudnnAddTensor(call.handle, one_beta.alpha(call.type), call.d.bias,
                                      bias.raw(), one_beta.beta(call.type), call.d.y, y.raw()));
  }
}

void CudaBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Conv2dGeometry& g,
                                       Tensor& dx) {
  ConvCall call;
  describe(call, dx, w, dy, g);
  run_math(call, call.plan.data_math);
  Tensor ws = workspace(call.plan.data_bytes, dy.device());
  const Scalars s = scalars(1.0, 0.0);
  ACCRUE_CUDNN_CHECK(
      cudnnConvolutionBackwardData(call.handle, s.alpha(call.type), call.d.w, w.raw(), call.d.y,
                                   dy.raw(), call.d.conv, call.plan.backward_data, raw_or_null(ws),
                                   call.plan.data_bytes, s.beta(call.type), call.d.x, dx.raw()));
}

void CudaBackend::conv2d_backward_filter(const Tensor& dy, const Tensor& x, const Conv2dGeometry& g,
                                         double beta, Tensor& dw, Tensor& dbias) {
  // dw = beta dw + dy (x) x; dbias = beta dbias + sum of dy: beta = 1 into the arena. The filter
  // gradient as one GEMM where it can (lowered_filter_gradient), else cuDNN's.
  ConvCall call;
  describe(call, x, dw, dy, g);
  const Scalars s = scalars(1.0, beta);
  if (!lowered_filter_gradient(*this, dy, x, g, beta, dw)) {
    run_math(call, call.plan.filter_math);
    Tensor ws = workspace(call.plan.filter_bytes, x.device());
    ACCRUE_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        call.handle, s.alpha(call.type), call.d.x, x.raw(), call.d.y, dy.raw(), call.d.conv,
        call.plan.backward_filter, raw_or_null(ws), call.plan.filter_bytes, s.beta(call.type),
        call.d.w, dw.raw()));
  }
  if (dbias.defined()) {
    ACCRUE_CUDNN_CHECK(cudnnConvolutionBackwardBias(call.handle, s.alpha(call.type), call.d.y,
                                                    dy.raw(), s.beta(call.type), call.d.bias,
                                                    dbias.raw()));
  }
}

#else  // no cuDNN

namespace {
[[noreturn]] void no_cudnn() {
  throw DeviceError("[conv2d] this accrue was " + cuda_conv_unavailable_reason());
}
}  // namespace

void CudaBackend::conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&,
                                 Tensor&) {
  no_cudnn();
}
void CudaBackend::conv2d_backward_data(const Tensor&, const Tensor&, const Conv2dGeometry&,
                                       Tensor&) {
  no_cudnn();
}
void CudaBackend::conv2d_backward_filter(const Tensor&, const Tensor&, const Conv2dGeometry&,
                                         double, Tensor&, Tensor&) {
  no_cudnn();
}

#endif

}  // namespace accrue::cuda

namespace accrue {

std::string cuda_conv_unavailable_reason() {
#if defined(ACCRUE_WITH_CUDNN)
  return "";
#else
  return "built without cuDNN: install cuDNN 9 beside the CUDA toolkit and reconfigure";
#endif
}

}  // namespace accrue
