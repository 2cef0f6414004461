// CUDA normalisation over x [N, C, S] and dropout. One block per normalised set (a sample's
// group for group norm, a channel for batch norm) reduces with cub::BlockReduce in double, in
// a fixed order (bitwise reproducible), then applies kernels/functors.h's NormApply / NormGrad;
// the affine gradients take one block per channel. A set is `segments` runs of `run` elements
// `stride` apart, starting at `base`. Dropout is one grid-stride map of fn::DropoutMask.
#include <cub/block/block_reduce.cuh>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cuda {

namespace {

struct Pair {
  double a, b;
};
struct PairSum {
  __device__ Pair operator()(const Pair& x, const Pair& y) const { return {x.a + y.a, x.b + y.b}; }
};

// Where a set lives: element e of set `set` is at base(set) + (e / run) * stride + e % run.
struct SetLayout {
  int64_t segments, run, stride;
  __host__ __device__ int64_t count() const { return segments * run; }
  __host__ __device__ int64_t at(int64_t base, int64_t e) const {
    return base + (e / run) * stride + e % run;
  }
};

// The sum over the block of f(e) for e in [0, count), on every thread.
template <typename F>
__device__ Pair block_sum(int64_t count, F f) {
  using BlockReduce = cub::BlockReduce<Pair, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  __shared__ Pair total;
  Pair acc{0, 0};
  for (int64_t e = threadIdx.x; e < count; e += kThreads) {
    const Pair v = f(e);
    acc.a += v.a;
    acc.b += v.b;
  }
  const Pair sum = BlockReduce(temp).Reduce(acc, PairSum{});
  if (threadIdx.x == 0) total = sum;
  __syncthreads();
  const Pair out = total;
  __syncthreads();
  return out;
}

// One block per set: mean, rstd; y = NormApply. channel(set, e) gives the affine channel.
// momentum >= 0 (batch norm): also the running statistics of the set's channel.
template <typename T, typename Base, typename Channel>
__global__ void normalize_kernel(const T* x, SetLayout l, Base base, Channel channel, double eps,
                                 const T* weight, const T* bias, double momentum, T* running_mean,
                                 T* running_var, bool use_running, T* y, T* mean, T* rstd) {
  const int64_t set = blockIdx.x, b = base(set);
  double m, r;
  if (use_running) {
    m = double(running_mean[set]);
    r = 1.0 / sqrt(double(running_var[set]) + eps);
  } else {
    const double count = double(l.count());
    m = block_sum(l.count(), [&](int64_t e) { return Pair{double(x[l.at(b, e)]), 0.0}; }).a / count;
    const double var = block_sum(l.count(),
                                 [&](int64_t e) {
                                   const double d = double(x[l.at(b, e)]) - m;
                                   return Pair{d * d, 0.0};
                                 })
                           .a /
                       count;
    r = 1.0 / sqrt(var + eps);
    if (threadIdx.x == 0 && momentum >= 0 && running_mean != nullptr) {
      running_mean[set] = T((1 - momentum) * double(running_mean[set]) + momentum * m);
      running_var[set] =
          T((1 - momentum) * double(running_var[set]) + momentum * var * count / (count - 1));
    }
  }
  if (threadIdx.x == 0) {
    mean[set] = T(m);
    rstd[set] = T(r);
  }
  const fn::NormApply apply;
  for (int64_t e = threadIdx.x; e < l.count(); e += kThreads) {
    const int64_t c = channel(set, e);
    const int64_t i = l.at(b, e);
    y[i] = apply(x[i], T(m), T(r), weight ? weight[c] : T(1), bias ? bias[c] : T(0));
  }
}

// One block per set: dx = NormGrad (or dy w rstd with constant statistics).
template <typename T, typename Base, typename Channel>
__global__ void norm_grad_kernel(const T* dy, const T* x, SetLayout l, Base base, Channel channel,
                                 const T* weight, const T* mean, const T* rstd, bool constant,
                                 T* dx) {
  const int64_t set = blockIdx.x, b = base(set);
  const T m = mean[set], r = rstd[set];
  if (constant) {
    for (int64_t e = threadIdx.x; e < l.count(); e += kThreads) {
      const int64_t i = l.at(b, e);
      dx[i] = dy[i] * (weight ? weight[channel(set, e)] : T(1)) * r;
    }
    return;
  }
  const Pair s = block_sum(l.count(), [&](int64_t e) {
    const int64_t i = l.at(b, e);
    const double g = double(dy[i]) * (weight ? double(weight[channel(set, e)]) : 1.0);
    return Pair{g, g * (double(x[i]) - double(m)) * double(r)};
  });
  const T mean_g = T(s.a / double(l.count())), mean_gx = T(s.b / double(l.count()));
  const fn::NormGrad grad;
  for (int64_t e = threadIdx.x; e < l.count(); e += kThreads) {
    const int64_t i = l.at(b, e);
    const T w = weight ? weight[channel(set, e)] : T(1);
    dx[i] = grad(dy[i] * w, (x[i] - m) * r, r, mean_g, mean_gx);
  }
}

// One block per channel ch of x [n, c, s]: dweight = beta dweight + sum dy xhat, dbias likewise
// with sum dy; stats(sample, ch) gives the index of the statistics used.
template <typename T, typename Stats>
__global__ void affine_grad_kernel(const T* dy, const T* x, int64_t n, int64_t c, int64_t s,
                                   Stats stats, const T* mean, const T* rstd, double beta,
                                   T* dweight, T* dbias) {
  const int64_t ch = blockIdx.x;
  const Pair sums = block_sum(n * s, [&](int64_t e) {
    const int64_t sample = e / s, i = (sample * c + ch) * s + e % s;
    const int64_t k = stats(sample, ch);
    const double g = double(dy[i]);
    return Pair{g * (double(x[i]) - double(mean[k])) * double(rstd[k]), g};
  });
  if (threadIdx.x == 0) {
    const fn::Blend blend{1.0, beta};
    if (dweight) dweight[ch] = T(blend(double(dweight[ch]), sums.a));
    if (dbias) dbias[ch] = T(blend(double(dbias[ch]), sums.b));
  }
}

// Group layout: set = n * groups + g, contiguous per * s elements; channel = g * per + e / s.
struct GroupBase {
  int64_t size;
  __host__ __device__ int64_t operator()(int64_t set) const { return set * size; }
};
struct GroupChannel {
  int64_t groups, per, s;
  __host__ __device__ int64_t operator()(int64_t set, int64_t e) const {
    return (set % groups) * per + e / s;
  }
};
struct GroupStats {
  int64_t groups, per;
  __host__ __device__ int64_t operator()(int64_t sample, int64_t ch) const {
    return sample * groups + ch / per;
  }
};
// Batch layout: set = channel, N runs of s elements, c s apart.
struct ChannelBase {
  int64_t s;
  __host__ __device__ int64_t operator()(int64_t set) const { return set * s; }
};
struct ChannelOf {
  __host__ __device__ int64_t operator()(int64_t set, int64_t) const { return set; }
};
struct ChannelStats {
  __host__ __device__ int64_t operator()(int64_t, int64_t ch) const { return ch; }
};

}  // namespace

void CudaBackend::group_norm(const Tensor& x, int64_t groups, double eps, const Tensor& weight,
                             const Tensor& bias, Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2), per = c / groups;
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "group_norm", [&] {
    const SetLayout l{1, per * s, 0};
    normalize_kernel<<<static_cast<unsigned>(n * groups), kThreads, 0, stream_of(x)>>>(
        x.data<T>(), l, GroupBase{per * s}, GroupChannel{groups, per, s}, eps,
        optional_data<T>(weight), optional_data<T>(bias), -1.0, static_cast<T*>(nullptr),
        static_cast<T*>(nullptr), false, y.data<T>(), mean.data<T>(), rstd.data<T>());
    ACCRUE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::group_norm_backward(const Tensor& dy, const Tensor& x, int64_t groups,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                      Tensor& dx, double beta, Tensor& dweight, Tensor& dbias) {
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2), per = c / groups;
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "group_norm_backward", [&] {
    if (dx.defined()) {
      norm_grad_kernel<<<static_cast<unsigned>(n * groups), kThreads, 0, stream_of(x)>>>(
          dy.data<T>(), x.data<T>(), SetLayout{1, per * s, 0}, GroupBase{per * s},
          GroupChannel{groups, per, s}, optional_data<T>(weight), mean.data<T>(), rstd.data<T>(),
          false, dx.data<T>());
      ACCRUE_CUDA_LAUNCH_CHECK();
    }
    if (dweight.defined() || dbias.defined()) {
      affine_grad_kernel<<<static_cast<unsigned>(c), kThreads, 0, stream_of(x)>>>(
          dy.data<T>(), x.data<T>(), n, c, s, GroupStats{groups, per}, mean.data<T>(),
          rstd.data<T>(), beta, optional_data<T>(dweight), optional_data<T>(dbias));
      ACCRUE_CUDA_LAUNCH_CHECK();
    }
  });
}

// The fused group norm, ReLU and max pooling as the two primitives it stands for, through a
// temporary for the normalised activation (its gradient on the way back): the same bits by
// construction. A kernel that pools straight from the normalising block is left for the day a
// GPU can measure it.
void CudaBackend::group_norm_relu_max_pool2d(const Tensor& x, int64_t groups, double eps,
                                             const Tensor& weight, const Tensor& bias,
                                             const Pool2dGeometry& g, Tensor& y, Tensor& argmax,
                                             Tensor& mean, Tensor& rstd) {
  const Shape ncs{x.size(0), x.size(1), x.size(2) * x.size(3)};
  Tensor normalised = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor normalised_ncs = normalised.view(ncs);
  group_norm(x.view(ncs), groups, eps, weight, bias, normalised_ncs, mean, rstd);
  max_pool2d(normalised, g, true, y, argmax);
}

void CudaBackend::group_norm_relu_max_pool2d_backward(const Tensor& dy, const Tensor& argmax,
                                                      const Tensor& x, int64_t groups,
                                                      const Tensor& mean, const Tensor& rstd,
                                                      const Tensor& weight, const Pool2dGeometry&,
                                                      Tensor& dx, double beta, Tensor& dweight,
                                                      Tensor& dbias) {
  const Shape ncs{x.size(0), x.size(1), x.size(2) * x.size(3)};
  Tensor spread = Tensor::empty(x.shape(), x.dtype(), x.device());
  max_pool2d_backward(dy, argmax, spread);
  Tensor dx_ncs = dx.defined() ? dx.view(ncs) : Tensor();
  group_norm_backward(spread.view(ncs), x.view(ncs), groups, mean, rstd, weight, dx_ncs, beta,
                      dweight, dbias);
}

void CudaBackend::batch_norm(const Tensor& x, double eps, double momentum, bool use_running,
                             const Tensor& weight, const Tensor& bias, Tensor& running_mean,
                             Tensor& running_var, Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2);
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "batch_norm", [&] {
    normalize_kernel<<<static_cast<unsigned>(c), kThreads, 0, stream_of(x)>>>(
        x.data<T>(), SetLayout{n, s, c * s}, ChannelBase{s}, ChannelOf{}, eps,
        optional_data<T>(weight), optional_data<T>(bias), momentum, optional_data<T>(running_mean),
        optional_data<T>(running_var), use_running, y.data<T>(), mean.data<T>(), rstd.data<T>());
    ACCRUE_CUDA_LAUNCH_CHECK();
  });
}

void CudaBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, bool use_running,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                      Tensor& dx, double beta, Tensor& dweight, Tensor& dbias) {
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2);
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "batch_norm_backward", [&] {
    if (dx.defined()) {
      norm_grad_kernel<<<static_cast<unsigned>(c), kThreads, 0, stream_of(x)>>>(
          dy.data<T>(), x.data<T>(), SetLayout{n, s, c * s}, ChannelBase{s}, ChannelOf{},
          optional_data<T>(weight), mean.data<T>(), rstd.data<T>(), use_running, dx.data<T>());
      ACCRUE_CUDA_LAUNCH_CHECK();
    }
    if (dweight.defined() || dbias.defined()) {
      affine_grad_kernel<<<static_cast<unsigned>(c), kThreads, 0, stream_of(x)>>>(
          dy.data<T>(), x.data<T>(), n, c, s, ChannelStats{}, mean.data<T>(), rstd.data<T>(), beta,
          optional_data<T>(dweight), optional_data<T>(dbias));
      ACCRUE_CUDA_LAUNCH_CHECK();
    }
  });
}

namespace {

template <typename T>
void dropout_map(const T* in, const int32_t* sample, int64_t n, int64_t per_row,
                 fn::DropoutMask mask, T* out, cudaStream_t stream) {
  for_each(n, stream, [=] __device__(int64_t i) {
    const int64_t r = i / per_row;
    out[i] = mask(in[i], uint64_t(sample[r]), uint64_t(i - r * per_row));
  });
}

}  // namespace

void CudaBackend::dropout(const Tensor& x, const DropoutKey& key, const Tensor& samples,
                          Tensor& y) {
  const int64_t rows = x.size(0), per_row = rows ? x.numel() / rows : 1;
  const fn::DropoutMask mask{key.seed, static_cast<uint64_t>(key.step), key.p, 1.0 / (1.0 - key.p)};
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "dropout", [&] {
    dropout_map(x.data<T>(), samples.data<int32_t>(), x.numel(), per_row, mask, y.data<T>(),
                stream_of(x));
  });
}

}  // namespace accrue::cuda
