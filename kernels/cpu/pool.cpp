// CPU pooling over NCHW planes, one (sample, channel) plane per iteration: max pooling keeps the
// flat input index of each region's first maximum for its backward, average pooling divides by
// the whole region, padding included (PyTorch's count_include_pad default). With `relu` max
// pooling compares relu(x) tap by tap (max_pool2d_relu: the ReLU's own pass over the full-size
// input, forward and backward, disappears) and writes argmax -1 where the maximum is not
// positive, where relu's gradient is zero; the backward adds nothing at -1.
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/scratch.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

namespace {

PlaneShape plane_shape(const Tensor& x, const Tensor& y) {
  return {x.size(0) * x.size(1), x.size(2), x.size(3), y.size(2), y.size(3)};
}

// body(oh, ow, h0, h1, w0, w1) for every output position of one plane: its pooling region
// clipped to the input, [h0, h1) x [w0, w1).
template <typename F>
void for_plane_regions(const PlaneShape& s, const Pool2dGeometry& g, F body) {
  for (int64_t oh = 0; oh < s.oh; ++oh) {
    const int64_t start_h = oh * g.stride_h - g.pad_h;
    const int64_t h0 = std::max<int64_t>(start_h, 0), h1 = std::min(start_h + g.kernel_h, s.h);
    for (int64_t ow = 0; ow < s.ow; ++ow) {
      const int64_t start_w = ow * g.stride_w - g.pad_w;
      const int64_t w0 = std::max<int64_t>(start_w, 0), w1 = std::min(start_w + g.kernel_w, s.w);
      body(oh, ow, h0, h1, w0, w1);
    }
  }
}

// body(plane, oh, ow, h0, h1, w0, w1) for every output position of every plane, planes shared
// out over the threads.
template <typename F>
void for_regions(const PlaneShape& s, const Pool2dGeometry& g, F body) {
  for_range(s.planes, s.planes * s.oh * s.ow * g.kernel_h * g.kernel_w, [&](int64_t p) {
    for_plane_regions(s, g,
                      [&](int64_t oh, int64_t ow, int64_t h0, int64_t h1, int64_t w0, int64_t w1) {
                        body(p, oh, ow, h0, h1, w0, w1);
                      });
  });
}

using fn::pool_beats;

// keep ? v : +0, as a mask on v's bits: GCC turns such selects into branches in the loops below
// (18 times slower on random data), the mask it computes without one.
template <typename T>
T kept_or_zero(bool keep, T v) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  static_assert(sizeof(Bits) == sizeof(T), "float32 or float64");
  Bits bits;
  std::memcpy(&bits, &v, sizeof(T));
  bits &= Bits(0) - Bits(keep);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

// The value a tap competes with: x, or relu(x), fn::Relu's values (+0 where x < 0, else x itself,
// NaN and -0 included).
template <bool kRelu, typename T>
T tap(T x) {
  if constexpr (kRelu) {
    return kept_or_zero(!(x < T(0)), x);
  } else {
    return x;
  }
}

// The argmax kept for the backward (fn::relu_pool_argmax after the ReLU).
template <bool kRelu, typename T>
int32_t routed(int32_t at, T best) {
  if constexpr (kRelu) {
    return fn::relu_pool_argmax(at, best);
  } else {
    return at;
  }
}

// Max pooling of one plane whose regions all lie inside it (no padding, so no clipping), tap by
// tap in the region order (rows, then columns): each tap's value for every output of the plane is
// loaded through starts[j], the flat input index of output j's region, and compared with the
// running maxima in one branch-free pass over the plane's outputs, which the compiler turns into
// vector gathers, compares and blends (a plane's output rows, 14 or 7 wide on MNIST, are too short
// to vectorise one by one). The same maxima and first-maximum indices as the region-by-region loop.
template <bool kRelu, typename T>
void max_pool_plane_inside(const T* __restrict plane, const PlaneShape& s, const Pool2dGeometry& g,
                           const int32_t* __restrict starts, T* __restrict best,
                           int32_t* __restrict at) {
  const int64_t n = s.oh * s.ow;
  for (int64_t j = 0; j < n; ++j) {
    best[j] = tap<kRelu>(plane[starts[j]]);
    at[j] = starts[j];
  }
  for (int64_t ki = 0; ki < g.kernel_h; ++ki) {
    for (int64_t kj = ki == 0 ? 1 : 0; kj < g.kernel_w; ++kj) {
      const int32_t offset = static_cast<int32_t>(ki * s.w + kj);
      for (int64_t j = 0; j < n; ++j) {
        const T v = tap<kRelu>(plane[starts[j] + offset]);
        const bool take = pool_beats(v, best[j]);
        best[j] = take ? v : best[j];
        at[j] = take ? starts[j] + offset : at[j];
      }
    }
  }
  for (int64_t j = 0; j < n; ++j) at[j] = routed<kRelu>(at[j], best[j]);
}

// Max pooling 2 x 2 with stride 2 of `count` consecutive planes whose width is even (W = 2 OW),
// in two linear passes instead of max_pool_plane_inside's gathers:
// - per plane, the horizontal pairs of the 2 OH rows in use, pair q being the plane's flat
//   elements 2q and 2q + 1 (rows included, since W is even), the first of the two on a tie;
// - each output the better of its top and bottom pair, the top one on a tie, over the output rows
//   of all the planes at once (the pairs lie as [count OH, 2, OW], the outputs as [count OH, OW]).
// That is the taps in region order (a, b, then c, d). An output row (7 or 14 wide on MNIST) is
// shorter than a loop the compiler vectorises, so every row but the last ones runs kPoolLanes
// outputs, the lanes past the row overwriting the next rows' outputs, which those rows rewrite
// right after; rows whose lanes would run past the group's outputs take the exact loop. pair_best
// and pair_at hold 2 count OH OW + kPoolLanes entries (the wide rows read past the last pair).
constexpr int64_t kPoolLanes = 16;
constexpr int64_t kPoolPlanesPerTask = 8;

template <bool kRelu, typename T>
void max_pool_planes_2x2(const T* __restrict planes, int64_t count, const PlaneShape& s,
                         T* __restrict pair_best, int32_t* __restrict pair_at, T* __restrict best,
                         int32_t* __restrict at) {
  const int64_t pairs = 2 * s.oh * s.ow;  // per plane
  for (int64_t k = 0; k < count; ++k) {
    const T* plane = planes + k * s.h * s.w;
    T* plane_best = pair_best + k * pairs;
    int32_t* plane_at = pair_at + k * pairs;
#pragma omp simd
    for (int64_t q = 0; q < pairs; ++q) {
      const T a = tap<kRelu>(plane[2 * q]), b = tap<kRelu>(plane[2 * q + 1]);
      const bool take = pool_beats(b, a);
      plane_best[q] = take ? b : a;
      plane_at[q] = static_cast<int32_t>(2 * q) + static_cast<int32_t>(take);
    }
  }
  const int64_t ow = s.ow, rows = count * s.oh;
  const auto bottom_wins = [&](int64_t i, int64_t len) {
    const T* top = pair_best + 2 * i * ow;
    const int32_t* top_at = pair_at + 2 * i * ow;
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) {
      const bool take = pool_beats(top[ow + j], top[j]);
      const T winner = take ? top[ow + j] : top[j];
      best[i * ow + j] = winner;
      at[i * ow + j] = routed<kRelu>(take ? top_at[ow + j] : top_at[j], winner);
    }
  };
  for (int64_t i = 0; i < rows; ++i) {
    bottom_wins(i, ow <= kPoolLanes && i * ow + kPoolLanes <= rows * ow ? kPoolLanes : ow);
  }
}

// Max pooling of one plane region by region, the regions clipped to the plane (padding).
template <bool kRelu, typename T>
void max_pool_plane_clipped(const T* plane, const PlaneShape& s, const Pool2dGeometry& g, T* out,
                            int32_t* at) {
  for_plane_regions(s, g,
                    [&](int64_t oh, int64_t ow, int64_t h0, int64_t h1, int64_t w0, int64_t w1) {
                      T best = -std::numeric_limits<T>::infinity();
                      int64_t best_at = h0 * s.w + w0;
                      for (int64_t ih = h0; ih < h1; ++ih) {
                        for (int64_t iw = w0; iw < w1; ++iw) {
                          const T v = tap<kRelu>(plane[ih * s.w + iw]);
                          if (pool_beats(v, best)) {
                            best = v;
                            best_at = ih * s.w + iw;
                          }
                        }
                      }
                      out[oh * s.ow + ow] = best;
                      at[oh * s.ow + ow] = routed<kRelu>(static_cast<int32_t>(best_at), best);
                    });
}

// `count` planes by the fastest of the three loops above that applies.
template <bool kRelu, typename T>
void max_pool_some_planes(const T* in, int64_t count, const PlaneShape& s, const Pool2dGeometry& g,
                          T* scratch, int32_t* scratch_at, T* out, int32_t* at) {
  const int64_t n = s.oh * s.ow;
  if (n == 0) return;
  const bool inside = g.pad_h == 0 && g.pad_w == 0 && (s.oh - 1) * g.stride_h + g.kernel_h <= s.h &&
                      (s.ow - 1) * g.stride_w + g.kernel_w <= s.w;
  if (pools_2x2(s, g)) {
    max_pool_planes_2x2<kRelu>(in, count, s, scratch, scratch_at, out, at);
    return;
  }
  if (inside) {
    int32_t* starts = scratch_at;
    for (int64_t j = 0; j < n; ++j) {
      starts[j] = static_cast<int32_t>((j / s.ow) * g.stride_h * s.w + (j % s.ow) * g.stride_w);
    }
    for (int64_t k = 0; k < count; ++k) {
      max_pool_plane_inside<kRelu>(in + k * s.h * s.w, s, g, starts, out + k * n, at + k * n);
    }
    return;
  }
  for (int64_t k = 0; k < count; ++k) {
    max_pool_plane_clipped<kRelu>(in + k * s.h * s.w, s, g, out + k * n, at + k * n);
  }
}

}  // namespace

int64_t max_pool_scratch(int64_t count, const PlaneShape& s) {
  return 2 * count * s.oh * s.ow + kPoolLanes;
}

template <typename T>
void max_pool_planes(const T* in, int64_t count, const PlaneShape& s, const Pool2dGeometry& g,
                     bool relu, T* scratch, int32_t* scratch_at, T* y, int32_t* argmax) {
  if (relu) {
    max_pool_some_planes<true>(in, count, s, g, scratch, scratch_at, y, argmax);
  } else {
    max_pool_some_planes<false>(in, count, s, g, scratch, scratch_at, y, argmax);
  }
}

bool pools_2x2(const PlaneShape& s, const Pool2dGeometry& g) {
  return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
         g.pad_w == 0 && s.w == 2 * s.ow && s.h >= 2 * s.oh;
}

template <typename T>
void max_pool_backward_planes(const T* dy, const int32_t* argmax, int64_t count,
                              const PlaneShape& s, bool two_by_two, T* dx) {
  const int64_t area = s.h * s.w, outputs = s.oh * s.ow;
  for (int64_t p = 0; p < count; ++p) {
    T* plane = dx + p * area;
    const T* grad = dy + p * outputs;
    const int32_t* at = argmax + p * outputs;
    std::fill(plane, plane + area, T(0));
    if (!two_by_two) {
      for (int64_t o = 0; o < outputs; ++o) {
        if (at[o] >= 0) plane[at[o]] += grad[o];
      }
      continue;
    }
    // Disjoint regions: no two outputs share an argmax, so the adds onto the zeros (0 + dy) are
    // independent and go out as vector scatters.
#pragma omp simd
    for (int64_t o = 0; o < outputs; ++o) {
      if (at[o] >= 0) plane[at[o]] = T(0) + grad[o];
    }
  }
}

template void max_pool_planes(const float*, int64_t, const PlaneShape&, const Pool2dGeometry&, bool,
                              float*, int32_t*, float*, int32_t*);
template void max_pool_planes(const double*, int64_t, const PlaneShape&, const Pool2dGeometry&,
                              bool, double*, int32_t*, double*, int32_t*);
template void max_pool_backward_planes(const float*, const int32_t*, int64_t, const PlaneShape&,
                                       bool, float*);
template void max_pool_backward_planes(const double*, const int32_t*, int64_t, const PlaneShape&,
                                       bool, double*);

void CpuBackend::max_pool2d(const Tensor& x, const Pool2dGeometry& g, bool relu, Tensor& y,
                            Tensor& argmax) {
  const PlaneShape s = plane_shape(x, y);
  const int64_t n = s.oh * s.ow, group = kPoolPlanesPerTask;
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "max_pool2d", [&] {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    int32_t* at = argmax.data<int32_t>();
    ThreadScratch<T> scratch(1, max_pool_scratch(group, s), x.dtype());
    ThreadScratch<int32_t> scratch_at(1, max_pool_scratch(group, s), DType::kInt32);
    for_range((s.planes + group - 1) / group, s.planes * s.h * s.w, [&](int64_t task) {
      const int64_t p = task * group, count = std::min(group, s.planes - p);
      max_pool_planes(in + p * s.h * s.w, count, s, g, relu, scratch.mine(), scratch_at.mine(),
                      out + p * n, at + p * n);
    });
  });
}

void CpuBackend::max_pool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  // dx [planes, H W] = 0, then dx[argmax] += dy where argmax >= 0, plane by plane
  // (no geometry here: regions may overlap, so the scatter)
  const PlaneShape s = plane_shape(dx, dy);
  const int64_t planes = s.planes, area = s.h * s.w, outputs = s.oh * s.ow;
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "max_pool2d_backward", [&] {
    const T* grad = dy.data<T>();
    const int32_t* at = argmax.data<int32_t>();
    T* out = dx.data<T>();
    for_range(planes, planes * (area + outputs), [=](int64_t p) {
      max_pool_backward_planes(grad + p * outputs, at + p * outputs, 1, s, false, out + p * area);
    });
  });
}

void CpuBackend::avg_pool2d(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  const PlaneShape s = plane_shape(x, y);
  ACCRUE_DISPATCH_FLOATING(x.dtype(), "avg_pool2d", [&] {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const T inv = T(1) / T(g.kernel_h * g.kernel_w);
    for_regions(
        s, g,
        [&](int64_t p, int64_t oh, int64_t ow, int64_t h0, int64_t h1, int64_t w0, int64_t w1) {
          const T* plane = in + p * s.h * s.w;
          T total = 0;
          for (int64_t ih = h0; ih < h1; ++ih) {
            for (int64_t iw = w0; iw < w1; ++iw) total += plane[ih * s.w + iw];
          }
          out[(p * s.oh + oh) * s.ow + ow] = total * inv;
        });
  });
}

void CpuBackend::avg_pool2d_backward(const Tensor& dy, const Pool2dGeometry& g, Tensor& dx) {
  const PlaneShape s = plane_shape(dx, dy);
  ACCRUE_DISPATCH_FLOATING(dy.dtype(), "avg_pool2d_backward", [&] {
    const T* grad = dy.data<T>();
    T* out = dx.data<T>();
    std::memset(out, 0, dx.nbytes());
    const T inv = T(1) / T(g.kernel_h * g.kernel_w);
    // A plane's regions run in order on one thread, so overlapping regions add in order.
    for_regions(
        s, g,
        [&](int64_t p, int64_t oh, int64_t ow, int64_t h0, int64_t h1, int64_t w0, int64_t w1) {
          T* plane = out + p * s.h * s.w;
          const T share = grad[(p * s.oh + oh) * s.ow + ow] * inv;
          for (int64_t ih = h0; ih < h1; ++ih) {
            for (int64_t iw = w0; iw < w1; ++iw) plane[ih * s.w + iw] += share;
          }
        });
  });
}

}  // namespace accrue::cpu
