// CUDA reductions. Full reductions (sum_all, norm_sq) are deterministic two-stage reductions:
// a fixed grid of kReduceBlocks blocks each reduces a fixed grid-stride share with
// cub::BlockReduce into a partial, then one block reduces the partials in a fixed order; up to
// kOneBlockReduce elements, one block alone. The grid does not depend on the device, so results
// are bitwise reproducible. Sums are in double.
// Column sums (sum_rows, and the fused ReLU + bias backward) split each column into fixed row
// slices, summed in order in the compute type.
#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cuda {

namespace {

// Enough blocks to keep every SM of an H100 busy (132 SMs x 8 blocks of 256 threads); fixed, so
// each element always lands in the same partial.
constexpr int kReduceBlocks = 1056;

struct Pair {
  double a, b;
};
struct PairSum {
  __device__ Pair operator()(const Pair& x, const Pair& y) const { return {x.a + y.a, x.b + y.b}; }
};

// x [n] -> partial [kReduceBlocks] = per-block sums of f(x[i]) (f returns a Pair). float
// input that is 16-byte aligned is read with float4 loads, the tail one element at a time.
template <typename T, typename F>
__global__ void reduce_stage1(const T* x, int64_t n, F f, Pair* partial) {
  using BlockReduce = cub::BlockReduce<Pair, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  Pair acc{0, 0};
  const auto add = [&](T value) {
    const Pair v = f(value);
    acc.a += v.a;
    acc.b += v.b;
  };
  const int64_t first = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  int64_t tail = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (aligned16(x)) {
      const float4* x4 = reinterpret_cast<const float4*>(x);
      for (int64_t i = first; i < n / 4; i += stride) {
        const float4 v = x4[i];
        add(v.x);
        add(v.y);
        add(v.z);
        add(v.w);
      }
      tail = n / 4 * 4;
    }
  }
  for (int64_t i = tail + first; i < n; i += stride) add(x[i]);
  const Pair total = BlockReduce(temp).Reduce(acc, PairSum{});
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

static_assert(kReduceBlocks * sizeof(Pair) <= DeviceContext::kReducePartialBytes,
              "the context's partials buffer must hold one Pair per block");

// x [n] -> write(sum of f(x[i])) on one thread of one block: thread t adds elements t,
// t + kThreads, ... in order, then the block's sums are reduced. Stage 2 of every reduction (over
// stage 1's partials), and the whole of a small one (a micro-step's loss over its rows), where
// stage 1's fixed grid would be almost all idle.
constexpr int64_t kOneBlockReduce = 64 * kThreads;
struct SamePair {  // stage 2's f: a partial as it is
  __device__ Pair operator()(const Pair& p) const { return p; }
};
template <typename T, typename F, typename W>
__global__ void reduce_one_block(const T* x, int64_t n, F f, W write) {
  using BlockReduce = cub::BlockReduce<Pair, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  Pair acc{0, 0};
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const Pair v = f(x[i]);
    acc.a += v.a;
    acc.b += v.b;
  }
  const Pair total = BlockReduce(temp).Reduce(acc, PairSum{});
  if (threadIdx.x == 0) write(total);
}

// The partials live in the device context, not the caching allocator: a reduction in the middle
// of a micro-step must not count as activation memory. Which of the two forms runs depends on n
// alone, so a sum's bits do too.
template <typename T, typename F, typename W>
void reduce_all(const T* x, int64_t n, Device device, F f, W write) {
  DeviceContext& ctx = context(device.index);
  if (n <= kOneBlockReduce) {
    reduce_one_block<<<1, kThreads, 0, ctx.stream>>>(x, n, f, write);
    ACCRUE_CUDA_LAUNCH_CHECK();
    return;
  }
  Pair* p = static_cast<Pair*>(ctx.reduce_partials);
  cudaStream_t s = ctx.stream;
  reduce_stage1<<<kReduceBlocks, kThreads, 0, s>>>(x, n, f, p);
  ACCRUE_CUDA_LAUNCH_CHECK();
  reduce_one_block<<<1, kThreads, 0, s>>>(static_cast<const Pair*>(p), int64_t{kReduceBlocks},
                                          SamePair{}, write);
  ACCRUE_CUDA_LAUNCH_CHECK();
}

// Column sums: a block takes kColumnTile consecutive columns (a warp's lanes, so each row's loads
// coalesce) in kSlices row slices. The thread of slice s sums rows s, s + kSlices, ... in order;
// the slices' sums are then added in slice order. The split depends on the shape alone, so the
// sums are reproducible, and a tall matrix's rows (G2P's bias gradients: some 600) are walked by
// eight threads a column.
constexpr int kColumnTile = 32;
constexpr int kSlices = kThreads / kColumnTile;
static_assert(kThreads % kColumnTile == 0, "a block is whole row slices of the column tile");

// out [C] = blend(out, sum over n of value(n C + c)) for each column c of an [N, C] matrix, in the
// compute type C; value(i) is called once for every element.
template <typename C, typename O, typename F>
__global__ void __launch_bounds__(kThreads)
    column_sums_kernel(int64_t rows, int64_t cols, F value, fn::Blend blend, O* out) {
  __shared__ C slice_sums[kSlices][kColumnTile];
  const int lane = threadIdx.x % kColumnTile, slice = threadIdx.x / kColumnTile;
  const int64_t c = blockIdx.x * int64_t(kColumnTile) + lane;
  C acc = 0;
  if (c < cols) {
    for (int64_t r = slice; r < rows; r += kSlices) acc += value(r * cols + c);
  }
  slice_sums[slice][lane] = acc;
  __syncthreads();
  if (slice == 0 && c < cols) {
    C total = slice_sums[0][lane];
    for (int k = 1; k < kSlices; ++k) total += slice_sums[k][lane];
    out[c] = store<O>(blend(static_cast<C>(load(out[c])), total));
  }
}

// The values column_sums adds: x's elements; or the ReLU's backward mask (fn::ReluBackward, as
// unary_backward computes it), written to dz as they are summed.
template <typename T>
struct Elements {
  const T* x;
  __device__ compute_t<T> operator()(int64_t i) const { return load(x[i]); }
};
template <typename T>
struct ReluMasked {
  const T *y, *dy;
  T* dz;
  __device__ compute_t<T> operator()(int64_t i) const {
    using C = compute_t<T>;
    const T d = store<T>(fn::ReluBackward{}(load(y[i]), static_cast<C>(load(dy[i]))));
    dz[i] = d;
    return load(d);
  }
};

template <typename C, typename O, typename F>
void column_sums(int64_t rows, int64_t cols, F value, fn::Blend blend, O* out,
                 cudaStream_t stream) {
  if (cols == 0) return;
  const int64_t blocks = (cols + kColumnTile - 1) / kColumnTile;
  column_sums_kernel<C>
      <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(rows, cols, value, blend, out);
  ACCRUE_CUDA_LAUNCH_CHECK();
}

}  // namespace

void CudaBackend::sum_rows(const Tensor& x, double alpha, double beta, Tensor& out) {
  // x [N, C] -> out [C] = beta * out + alpha * sum_n x[n, :]; out of x's type or float32
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "sum_rows", [&] {
    with_wide_output<T>(out, "sum_rows", [&](auto* o) {
      column_sums<compute_t<T>>(x.size(0), x.size(1), Elements<T>{x.data<T>()},
                                fn::Blend{alpha, beta}, o, stream_of(x));
    });
  });
}

void CudaBackend::relu_bias_backward(const Tensor& y, const Tensor& dy, Tensor& dz, double beta,
                                     Tensor& dbias) {
  // y, dy [N, C] -> dz [N, C] = the ReLU's mask, and dbias [C] = beta * dbias + the column sums of
  // dz as stored (sum_rows over dz), in one pass
  if (!dbias.defined()) return unary_backward(UnaryOp::kRelu, y, dy, dz);
  ACCRUE_DISPATCH_FLOATING_AND_HALF(dy.dtype(), "relu_bias_backward", [&] {
    with_wide_output<T>(dbias, "relu_bias_backward", [&](auto* o) {
      column_sums<compute_t<T>>(dz.size(0), dz.size(1),
                                ReluMasked<T>{y.data<T>(), dy.data<T>(), dz.data<T>()},
                                fn::Blend{1.0, beta}, o, stream_of(dz));
    });
  });
}

template <typename T>
void reduce_sum(const T* x, int64_t n, Device device, T* out) {
  // x [n] -> out [1], in double, in a fixed order
  reduce_all<T>(
      x, n, device,
      [] __device__(T v) {
        return Pair{double(v), 0.0};
      },
      [=] __device__(Pair total) { out[0] = T(total.a); });
}
template void reduce_sum<float>(const float*, int64_t, Device, float*);
template void reduce_sum<double>(const double*, int64_t, Device, double*);

void CudaBackend::sum_all(const Tensor& x, Tensor& out) {
  // x [n] -> out [1]
  ACCRUE_DISPATCH_FLOATING_AND_HALF(
      x.dtype(), "sum", [&] { reduce_sum(x.data<T>(), x.numel(), x.device(), out.data<T>()); });
}

void CudaBackend::norm_sq(const Tensor& g, Tensor& out) {
  // g [n] -> out [2] = {sum g^2, count of non-finite entries}
  ACCRUE_DISPATCH_FLOATING(g.dtype(), "norm_sq", [&] {
    T* o = out.data<T>();
    reduce_all<T>(
        g.data<T>(), g.numel(), g.device(),
        [] __device__(T v) {
          const double d = double(v);
          return Pair{d * d, isfinite(d) ? 0.0 : 1.0};
        },
        [=] __device__(Pair total) {
          o[0] = T(total.a);
          o[1] = T(total.b);
        });
  });
}

void CudaBackend::argmax(const Tensor& x, Tensor& index) {
  // x [N, C] -> index [N]; one thread per row, first maximum wins
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "argmax", [&] {
    const T* in = x.data<T>();
    int32_t* idx = index.data<int32_t>();
    const int64_t cols = x.size(1);
    for_each(x.size(0), stream_of(x), [=] __device__(int64_t r) {
      const T* row = in + r * cols;
      int64_t best = 0;
      for (int64_t c = 1; c < cols; ++c) {
        if (load(row[c]) > load(row[best])) best = c;
      }
      idx[r] = static_cast<int32_t>(best);
    });
  });
}

void CudaBackend::count_equal(const Tensor& a, const Tensor& b, Tensor& out) {
  // a [n], b [n] -> out [1] = number of equal entries (integer atomics: order does not matter)
  const int32_t* pa = a.data<int32_t>();
  const int32_t* pb = b.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  cudaStream_t s = stream_of(out);
  ACCRUE_CUDA_CHECK(cudaMemsetAsync(o, 0, sizeof(int32_t), s));
  for_each(a.numel(), s, [=] __device__(int64_t i) {
    if (pa[i] == pb[i]) atomicAdd(o, 1);
  });
}

}  // namespace accrue::cuda
