// CPU normalisation over x [N, C, S]: group norm (statistics per sample and group of channels;
// layer norm is one group) and batch norm (statistics per channel over the batch, running
// statistics with PyTorch's momentum and unbiased variance). Statistics are two passes in
// double (mean, then the mean square deviation) in a fixed order, so results do not depend on
// the thread count; the per-element math is kernels/functors.h's NormApply and NormGrad, which
// the CUDA kernels share. Every kernel also takes bf16 and fp16 x (dy, dx, weight and bias alike):
// each element is loaded into float, and the statistics, running statistics and affine gradients
// are float32 (compute_t): the float32 kernel's arithmetic on the widened operands, rounded once,
// without widened copies in memory. (The compiler splits a run's double sums into vector lanes
// per element type, so a 16-bit kernel's sum may differ from float32's in its last double bits;
// the rounding to float hides that but for a near tie, about 2^-29 of the values.)
#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

namespace {

// The sums of f(i) and g(i) over a run of n elements, in double, in vector lanes (the compiler's
// fixed split of the run into lane-wise partial sums, added in a fixed order): the same order on
// every thread and every run, converted and accumulated a vector at a time. Scalar running sums
// measured 2.3x slower in group norm's backward.
template <typename F, typename G>
std::pair<double, double> run_sums(int64_t n, F f, G g) {
  double total_f = 0, total_g = 0;
#pragma omp simd reduction(+ : total_f, total_g)
  for (int64_t i = 0; i < n; ++i) {
    total_f += f(i);
    total_g += g(i);
  }
  return {total_f, total_g};
}

// A backward's sums over a run of n elements of dy and dy xhat, xhat = (x - m) r, and where
// kWeighted also of both times the channel's weight w, in double, in vector lanes in a fixed order
// (as run_sums), from one load and conversion of dy and x per element. One plain loop rather than
// run_sums' lambdas: a lambda's captured pointers are its own copies, so each lambda loads and
// converts dy again. Beside dy w (x - m) r the compiler computes dy w once for both and then does
// not fuse it into its own sum: for float that adds the same value (a product of two floats is
// exact in double); for double, whose sum of dy w is the fused one, it runs in a loop of its own.
struct DySums {
  double g, gx, wg, wgx;
};
template <bool kWeighted, typename G, typename T>
DySums dy_sums(const G* dy, const T* x, int64_t n, double m, double r, double w) {
  constexpr bool kExactProducts = std::is_same_v<compute_t<T>, float>;
  double g = 0, gx = 0, wg = 0, wgx = 0;
#pragma omp simd reduction(+ : g, gx, wg, wgx)
  for (int64_t i = 0; i < n; ++i) {
    const double gi = static_cast<double>(dy[i]), xi = static_cast<double>(x[i]);
    g += gi;
    gx += gi * (xi - m) * r;
    if constexpr (kWeighted) {
      if constexpr (kExactProducts) wg += gi * w;
      wgx += gi * w * (xi - m) * r;
    }
  }
  if constexpr (kWeighted && !kExactProducts) {
#pragma omp simd reduction(+ : wg)
    for (int64_t i = 0; i < n; ++i) wg += static_cast<double>(dy[i]) * w;
  }
  return {g, gx, wg, wgx};
}

// The mean and biased variance of two sets of elements at once, set k being `segments` runs of
// `run` elements each `stride` apart from a (k = 0) or b (k = 1); mean[k] and rstd[k] = 1 /
// sqrt(var + eps) stored in the compute type C, the variances returned. A set without a partner
// goes beside itself (statistics_of_one). The two sets' sums are run_sums' two chains in one loop,
// which overlap rather than wait on each other. Every set goes through this one loop whatever its
// partner, so its bits never depend on the batch around it (a loop of one set beside a chain of +0
// vectorises as this one on AVX2 and AVX-512 builds, but not on SSE2 ones).
template <typename T, typename C>
std::array<double, 2> statistics(const T* a, const T* b, int64_t segments, int64_t run,
                                 int64_t stride, double eps, C* mean, C* rstd) {
  // run_sums over the two sets' segment s, value(v, k) of each value v of set k
  const auto both_sums = [&](int64_t s, auto value) {
    const T *p = a + s * stride, *q = b + s * stride;
    return run_sums(
        run, [=](int64_t i) { return value(p[i], 0); }, [=](int64_t i) { return value(q[i], 1); });
  };
  const double count = static_cast<double>(segments * run);
  double total[2] = {0, 0};
  for (int64_t s = 0; s < segments; ++s) {
    const auto sums = both_sums(s, [](T v, int) { return static_cast<double>(v); });
    total[0] += sums.first;
    total[1] += sums.second;
  }
  const double m[2] = {total[0] / count, total[1] / count};
  double squares[2] = {0, 0};
  for (int64_t s = 0; s < segments; ++s) {
    const auto sums = both_sums(s, [m0 = m[0], m1 = m[1]](T v, int k) {
      const double d = static_cast<double>(v) - (k == 0 ? m0 : m1);
      return d * d;
    });
    squares[0] += sums.first;
    squares[1] += sums.second;
  }
  std::array<double, 2> variance;
  for (int k = 0; k < 2; ++k) {
    variance[k] = squares[k] / count;
    mean[k] = static_cast<C>(m[k]);
    rstd[k] = static_cast<C>(1.0 / std::sqrt(variance[k] + eps));
  }
  return variance;
}

// statistics of set a alone (beside itself): mean[0], rstd[0], and the variance returned.
template <typename T, typename C>
double statistics_of_one(const T* a, int64_t segments, int64_t run, int64_t stride, double eps,
                         C* mean, C* rstd) {
  C means[2], rstds[2];
  const double variance = statistics(a, a, segments, run, stride, eps, means, rstds)[0];
  *mean = means[0];
  *rstd = rstds[0];
  return variance;
}

// Channel ch's affine gradients from its sums of dy xhat and dy: dweight[ch] and dbias[ch] (beta
// blend), each where given.
template <typename T>
void write_affine_grads(int64_t ch, double sum_gx, double sum_g, double beta, T* dweight,
                        T* dbias) {
  const fn::Blend blend{1.0, beta};
  if (dweight != nullptr) dweight[ch] = static_cast<T>(blend(double(dweight[ch]), sum_gx));
  if (dbias != nullptr) dbias[ch] = static_cast<T>(blend(double(dbias[ch]), sum_g));
}

// Channel ch's sums of dy xhat and dy over N and S, into dweight[ch] and dbias[ch] (beta blend).
template <typename T, typename StatsOf>
void channel_affine_grads(const T* dy, const T* x, int64_t n, int64_t c, int64_t s, int64_t ch,
                          StatsOf stats_of, double beta, compute_t<T>* dweight,
                          compute_t<T>* dbias) {
  double sum_gx = 0, sum_g = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto [mean, rstd] = stats_of(i, ch);
    const int64_t at = (i * c + ch) * s;
    const auto [g_sum, gx_sum, unused_wg, unused_wgx] =
        dy_sums<false>(dy + at, x + at, s, mean, rstd, 1.0);
    sum_g += g_sum;
    sum_gx += gx_sum;
  }
  write_affine_grads(ch, sum_gx, sum_g, beta, dweight, dbias);
}

// Every channel's channel_affine_grads.
template <typename T, typename StatsOf>
void affine_grads(const T* dy, const T* x, int64_t n, int64_t c, int64_t s, StatsOf stats_of,
                  double beta, compute_t<T>* dweight, compute_t<T>* dbias) {
  if (dweight == nullptr && dbias == nullptr) return;
  for_range(c, n * c * s, [=](int64_t ch) {
    channel_affine_grads(dy, x, n, c, s, ch, stats_of, beta, dweight, dbias);
  });
}

// Layer norm's affine gradients (x [N, C, 1], one group): the per-channel sums over the rows of
// dy xhat and dy, reading rows rather than channels (a channel's walk down N rows C apart uses one
// value of each cache line). Rows are cut into blocks of a fixed size, whatever the thread count;
// each block sums its rows in order into its own partial sums, added in block order after.
template <typename T, typename C = compute_t<T>>
void row_affine_grads(const T* dy, const T* x, int64_t n, int64_t c, const C* mean, const C* rstd,
                      double beta, C* dweight, C* dbias) {
  if (dweight == nullptr && dbias == nullptr) return;
  constexpr int64_t kRowsPerBlock = 64;
  const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<double> partial(static_cast<size_t>(blocks * 2 * c), 0.0);
  double* sums = partial.data();
  for_range(blocks, n * c, [=](int64_t block) {
    double *gx = sums + block * 2 * c, *g = gx + c;
    for (int64_t r = block * kRowsPerBlock; r < std::min(n, (block + 1) * kRowsPerBlock); ++r) {
      const double m = static_cast<double>(mean[r]), rs = static_cast<double>(rstd[r]);
      const T *dy_row = dy + r * c, *x_row = x + r * c;
      for (int64_t ch = 0; ch < c; ++ch) {
        const double grad = static_cast<double>(dy_row[ch]);
        g[ch] += grad;
        gx[ch] += grad * (static_cast<double>(x_row[ch]) - m) * rs;
      }
    }
  });
  for_range(c, blocks * c, [=](int64_t ch) {
    double sum_gx = 0, sum_g = 0;
    for (int64_t block = 0; block < blocks; ++block) {
      sum_gx += sums[block * 2 * c + ch];
      sum_g += sums[block * 2 * c + c + ch];
    }
    write_affine_grads(ch, sum_gx, sum_g, beta, dweight, dbias);
  });
}

// Rows of layer norm's backward a block (one row a vector lane of doubles).
constexpr int kRowBlock = 8;

// staged [k] [j] = first[j * stride + k] as a double, for k < count and j < rows (rows at most
// kRowBlock). Eight features of the rows at a time are eight vector loads (converted to double)
// turned into eight vectors of features by an 8 x 8 transpose (vec::transpose: three rounds of
// shuffles); rows past `rows` load as zeros. The last count % 8 features go one value at a time.
template <typename T>
void stage_rows(const T* first, int64_t stride, int64_t rows, int64_t count,
                double (*staged)[kRowBlock]) {
  using V = vec::Vec<double, kRowBlock>;
  int64_t k = 0;
  for (; k + kRowBlock <= count; k += kRowBlock) {
    V v[kRowBlock];  // v[j]: row j's features k ... k + 7, then v[i]: feature k + i of every row
    for (int64_t j = 0; j < kRowBlock; ++j) {
      const T* at = first + j * stride + k;
      if (j >= rows) {
        v[j] = V{};
      } else if constexpr (std::is_same_v<T, double>) {
        v[j] = vec::load<double, kRowBlock>(at);
      } else if constexpr (is_half_v<T>) {
        alignas(64) double wide[kRowBlock];
        for (int64_t i = 0; i < kRowBlock; ++i) wide[i] = static_cast<double>(load(at[i]));
        v[j] = vec::load<double, kRowBlock>(wide);
      } else {
        v[j] = __builtin_convertvector(vec::load<T, kRowBlock>(at), V);
      }
    }
    vec::transpose<double, kRowBlock>(v);
    for (int64_t i = 0; i < kRowBlock; ++i) vec::store(staged[k + i], v[i]);
  }
  for (; k < count; ++k) {
    for (int64_t j = 0; j < rows; ++j) staged[k][j] = static_cast<double>(first[j * stride + k]);
  }
}

// dx of up to kRowBlock rows normalised on their own (layer norm, or group norm of [N, C, 1]),
// `stride` apart: each row's `features` values, with the weights w (the weight of the group's
// first channel on; null: ones) and the row's statistics mean[j * stat_stride], rstd[j *
// stat_stride]. Each feature's terms are what run_sums gives for a run of one element, round(g w)
// and round(g w (x - m) r): the products rounded on their own (a multiply-add onto +0, so they
// cannot be fused into the running sums), added in feature order. Each row's sums are one chain of
// additions, so the rows' chains run side by side, one row a vector lane: a block of features is
// first staged as [feature, row] doubles (the lanes past `rows` as zeros, never read back). A row's
// bits are those of the row alone, whatever the block.
template <typename T, typename C = compute_t<T>>
void norm_grad_rows(const T* dy, const T* x, T* dx, int64_t rows, int64_t stride, int64_t features,
                    const T* w, const C* mean, const C* rstd, int64_t stat_stride) {
  using V = vec::Vec<double, kRowBlock>;
  constexpr int64_t kStaged = 64;  // features a block
  alignas(64) double m[kRowBlock] = {}, r[kRowBlock] = {};
  alignas(64) double g_staged[kStaged][kRowBlock], x_staged[kStaged][kRowBlock];
  if (rows < kRowBlock) {  // the unused lanes: zeros rather than whatever bits the stack holds
    for (int64_t k = 0; k < kStaged; ++k) {
      std::fill(g_staged[k] + rows, g_staged[k] + kRowBlock, 0.0);
      std::fill(x_staged[k] + rows, x_staged[k] + kRowBlock, 0.0);
    }
  }
  for (int64_t j = 0; j < rows; ++j) {
    m[j] = static_cast<double>(mean[j * stat_stride]);
    r[j] = static_cast<double>(rstd[j * stat_stride]);
  }
  const V row_m = vec::load<double, kRowBlock>(m), row_r = vec::load<double, kRowBlock>(r);
  V sum_g{}, sum_gx{};
  for (int64_t k0 = 0; k0 < features; k0 += kStaged) {
    const int64_t count = std::min(kStaged, features - k0);
    stage_rows(dy + k0, stride, rows, count, g_staged);
    stage_rows(x + k0, stride, rows, count, x_staged);
    for (int64_t k = 0; k < count; ++k) {
      const V weight = vec::splat<V>(w ? static_cast<double>(w[k0 + k]) : 1.0);
      const V gw = vec::fma(vec::load<double, kRowBlock>(g_staged[k]), weight, V{});
      sum_g += gw;
      sum_gx += vec::fma(gw * (vec::load<double, kRowBlock>(x_staged[k]) - row_m), row_r, V{});
    }
  }
  const double count = static_cast<double>(features);
  const fn::NormGrad grad;
  for (int64_t j = 0; j < rows; ++j) {
    const C mean_g = static_cast<C>(sum_g[j] / count), mean_gx = static_cast<C>(sum_gx[j] / count);
    const C row_mean = mean[j * stat_stride], row_rstd = rstd[j * stat_stride];
    const T *g = dy + j * stride, *xs = x + j * stride;
    T* out = dx + j * stride;
    for (int64_t k = 0; k < features; ++k) {
      out[k] = store<T>(grad(load(g[k]) * (w ? load(w[k]) : C(1)),
                             (load(xs[k]) - row_mean) * row_rstd, row_rstd, mean_g, mean_gx));
    }
  }
}

// Batch norm's backward for channel ch of x [N, C, S] with its statistics: one pass over the
// channel's N runs gives the sums of dy and dy xhat both times the weight (dx's terms) and without
// it (the affine gradients, as channel_affine_grads sums them); a second pass writes dx. dy and x
// are read twice rather than three times.
template <typename T, typename C = compute_t<T>>
void batch_norm_channel_backward(const T* dy, const T* x, T* dx, int64_t n, int64_t c, int64_t s,
                                 int64_t ch, const T* weight, C mean, C rstd, double beta,
                                 C* dweight, C* dbias) {
  const double w = weight ? static_cast<double>(weight[ch]) : 1.0;
  const double m = static_cast<double>(mean), r = static_cast<double>(rstd);
  double sum_wg = 0, sum_wgx = 0, sum_g = 0, sum_gx = 0;
  for (int64_t i = 0; i < n; ++i) {
    const DySums sums = dy_sums<true>(dy + (i * c + ch) * s, x + (i * c + ch) * s, s, m, r, w);
    sum_wg += sums.wg;
    sum_wgx += sums.wgx;
    sum_g += sums.g;
    sum_gx += sums.gx;
  }
  const double count = static_cast<double>(n * s);
  const C mean_g = static_cast<C>(sum_wg / count), mean_gx = static_cast<C>(sum_wgx / count);
  const C wt = weight ? load(weight[ch]) : C(1);
  const fn::NormGrad grad;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t at = (i * c + ch) * s;
    const T *g = dy + at, *xs = x + at;
    T* out = dx + at;
    for (int64_t k = 0; k < s; ++k) {
      out[k] = store<T>(grad(load(g[k]) * wt, (load(xs[k]) - mean) * rstd, rstd, mean_g, mean_gx));
    }
  }
  write_affine_grads(ch, sum_gx, sum_g, beta, dweight, dbias);
}

// Group norm's forward over x [N, C, S], two groups at a time (the last alone when the count is
// odd): their statistics side by side, then for each its normalised [per, S] values written where
// target(ng) says (T or the compute type C), then done(ng, values) (the fused pooling reads them
// there).
template <typename T, typename C, typename Target, typename Done>
void group_norm_groups(const T* in, int64_t n, int64_t c, int64_t s, int64_t groups, double eps,
                       const T* w, const T* b, C* mu, C* rs, Target target, Done done) {
  const int64_t per = c / groups, total = n * groups, size = per * s;
  const auto normalise = [=](int64_t ng) {
    const int64_t at = ng * size, c0 = (ng % groups) * per;
    const fn::NormApply apply;
    // mean and rstd as locals: as far as the compiler knows, the target may alias them
    const C m = mu[ng], r = rs[ng];
    auto* values = target(ng);
    using V = std::remove_pointer_t<decltype(values)>;
    if (s == 1) {  // a row of features (layer norm): one vector loop over them, not one per value
#pragma omp simd
      for (int64_t k = 0; k < per; ++k) {
        values[k] = store<V>(
            apply(load(in[at + k]), m, r, w ? load(w[c0 + k]) : C(1), b ? load(b[c0 + k]) : C(0)));
      }
    } else {
      for (int64_t k = 0; k < per; ++k) {
        const C wk = w ? load(w[c0 + k]) : C(1), bk = b ? load(b[c0 + k]) : C(0);
        const T* channel = in + at + k * s;
        V* result = values + k * s;
        for (int64_t i = 0; i < s; ++i) result[i] = store<V>(apply(load(channel[i]), m, r, wk, bk));
      }
    }
    done(ng, values);
  };
  for_range((total + 1) / 2, n * c * s, [=](int64_t pair) {
    const int64_t ng = 2 * pair;
    if (ng + 1 < total) {
      statistics(in + ng * size, in + (ng + 1) * size, 1, size, 0, eps, mu + ng, rs + ng);
      normalise(ng);
      normalise(ng + 1);
    } else {
      statistics_of_one(in + ng * size, 1, size, 0, eps, mu + ng, rs + ng);
      normalise(ng);
    }
  });
}

// Group norm's backward over planes (S > 1): one pass over dy and x gives each (sample, channel)
// its sums of dy and dy xhat, which make both the group's dx terms and the affine gradients (the
// per-channel pass over N strided planes is gone); a second pass writes dx. group_dy(ng) gives
// group ng's dy [per, S], of T or the compute type C (the fused pooling's backward spreads it
// there first). Sums in double, in a fixed order.
template <typename T, typename C, typename GroupDy>
void group_norm_backward_planes(GroupDy group_dy, const T* x, int64_t n, int64_t c, int64_t s,
                                int64_t groups, const C* mean, const C* rstd, const T* weight,
                                T* dx, double beta, C* dweight, C* dbias) {
  const int64_t per = c / groups;
  std::vector<double> sums(static_cast<size_t>(2 * n * c));
  double *sum_g = sums.data(), *sum_gx = sum_g + n * c;
  for_range(n * groups, n * c * s, [=](int64_t ng) {
    const int64_t sample = ng / groups, c0 = (ng % groups) * per;
    const double m = static_cast<double>(mean[ng]), r = static_cast<double>(rstd[ng]);
    const auto* dy = group_dy(ng);
    double group_g = 0, group_gx = 0;
    for (int64_t k = 0; k < per; ++k) {
      const int64_t sc = sample * c + c0 + k;
      const auto [g_sum, gx_sum, unused_wg, unused_wgx] =
          dy_sums<false>(dy + k * s, x + sc * s, s, m, r, 1.0);
      sum_g[sc] = g_sum;
      sum_gx[sc] = gx_sum;
      const double w = weight ? static_cast<double>(weight[c0 + k]) : 1.0;
      group_g += w * g_sum;
      group_gx += w * gx_sum;
    }
    if (dx == nullptr) return;
    const double count = static_cast<double>(per * s);
    const C mean_g = static_cast<C>(group_g / count), mean_gx = static_cast<C>(group_gx / count);
    const fn::NormGrad grad;
    // mean and rstd as locals: as far as the compiler knows, dx may alias them, and reloading
    // them every element kept this loop from vectorising
    const C group_mean = mean[ng], group_rstd = rstd[ng];
    for (int64_t k = 0; k < per; ++k) {
      const int64_t at = (sample * c + c0 + k) * s;
      const C w = weight ? load(weight[c0 + k]) : C(1);
      const auto* g = dy + k * s;
      const T* xs = x + at;
      T* out = dx + at;
      for (int64_t i = 0; i < s; ++i) {
        out[i] = store<T>(grad(load(g[i]) * w, (load(xs[i]) - group_mean) * group_rstd, group_rstd,
                               mean_g, mean_gx));
      }
    }
  });
  if (dweight == nullptr && dbias == nullptr) return;
  for_range(c, n * c, [=](int64_t ch) {
    double total_g = 0, total_gx = 0;
    for (int64_t sample = 0; sample < n; ++sample) {
      total_g += sum_g[sample * c + ch];
      total_gx += sum_gx[sample * c + ch];
    }
    write_affine_grads(ch, total_gx, total_g, beta, dweight, dbias);
  });
}

// group_norm_backward for S = 1 (or an empty S = 0): rows of C values, each group of per of them
// normalised on its own.
template <typename T, typename C = compute_t<T>>
void rows_backward(const T* g, const T* in, T* out, int64_t n, int64_t c, int64_t s, int64_t groups,
                   const C* mu, const C* rs, const T* w, double beta, C* dweight, C* dbias) {
  const int64_t per = c / groups;
  if (out != nullptr && s == 1) {
    // blocks of kRowBlock samples' rows of one group (the same weights); rows one by one where
    // the blocks would be too few tasks to share out (a row's bits do not depend on its block)
    constexpr int64_t kMinTasks = 16;
    const int64_t block = n / kRowBlock * groups >= kMinTasks ? kRowBlock : 1;
    const int64_t blocks = (n + block - 1) / block;
    for_range(blocks * groups, n * c, [=](int64_t task) {
      const int64_t group = task % groups, first = task / groups * block;
      const int64_t at = first * c + group * per, ng = first * groups + group;
      norm_grad_rows(g + at, in + at, out + at, std::min(block, n - first), c, per,
                     w ? w + group * per : nullptr, mu + ng, rs + ng, groups);
    });
  }
  if (s == 1 && groups == 1) {  // layer norm
    row_affine_grads(g, in, n, c, mu, rs, beta, dweight, dbias);
    return;
  }
  affine_grads(
      g, in, n, c, s,
      [=](int64_t i, int64_t ch) {
        const int64_t ng = i * groups + ch / per;
        return std::pair<double, double>(mu[ng], rs[ng]);
      },
      beta, dweight, dbias);
}

// A group's normalised values (the compute type C) pooled into out: directly where T is C, else
// into the scratch `maxima` and rounded from there.
template <typename T, typename C>
void pool_group(const C* normalised, int64_t per, const PlaneShape& planes, const Pool2dGeometry& g,
                int32_t* scratch, C* maxima, T* out, int32_t* argmax) {
  if constexpr (std::is_same_v<T, C>) {
    max_pool_planes(normalised, per, planes, g, true, scratch, out, argmax);
  } else {
    max_pool_planes(normalised, per, planes, g, true, scratch, maxima, argmax);
    const int64_t pooled = per * planes.oh * planes.ow;
    for (int64_t i = 0; i < pooled; ++i) out[i] = store<T>(maxima[i]);
  }
}

// A group's pooled dy in the compute type C: itself where T is C, else widened into `wide`.
template <typename T, typename C>
const C* in_compute_type(const T* dy, int64_t count, C* wide) {
  if constexpr (std::is_same_v<T, C>) {
    return dy;
  } else {
    for (int64_t i = 0; i < count; ++i) wide[i] = load(dy[i]);
    return wide;
  }
}

}  // namespace

void CpuBackend::group_norm(const Tensor& x, int64_t groups, double eps, const Tensor& weight,
                            const Tensor& bias, Tensor& y, Tensor& mean, Tensor& rstd) {
  // x [N, C, S]; a group is C / groups consecutive channels of one sample: contiguous
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2), per = c / groups;
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "group_norm", [&] {
    using C = compute_t<T>;
    T* out = y.data<T>();
    group_norm_groups(
        x.data<T>(), n, c, s, groups, eps, optional_data<T>(weight), optional_data<T>(bias),
        mean.data<C>(), rstd.data<C>(), [=](int64_t ng) { return out + ng * per * s; },
        [](int64_t, const T*) {});
  });
}

void CpuBackend::group_norm_backward(const Tensor& dy, const Tensor& x, int64_t groups,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                     Tensor& dx, double beta, Tensor& dweight, Tensor& dbias) {
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2), per = c / groups;
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "group_norm_backward", [&] {
    using C = compute_t<T>;
    const T *g = dy.data<T>(), *in = x.data<T>(), *w = optional_data<T>(weight);
    const C *mu = mean.data<C>(), *rs = rstd.data<C>();
    T* out = optional_data<T>(dx);
    if (s > 1) {
      group_norm_backward_planes([=](int64_t ng) { return g + ng * per * s; }, in, n, c, s, groups,
                                 mu, rs, w, out, beta, optional_data<C>(dweight),
                                 optional_data<C>(dbias));
      return;
    }
    rows_backward(g, in, out, n, c, s, groups, mu, rs, w, beta, optional_data<C>(dweight),
                  optional_data<C>(dbias));
  });
}

// The fused form normalises a group into a per-thread [per, H W] buffer and pools it from there
// with max_pool2d_relu's loops; its backward spreads the pooled dy over the group's planes in a
// per-thread buffer (max_pool2d_backward's values: zeros, and 0 + dy at argmax) and runs the
// group's backward on it. The full-size normalised activation and its gradient never reach
// memory, and every value is the one the three separate primitives compute.
void CpuBackend::group_norm_relu_max_pool2d(const Tensor& x, int64_t groups, double eps,
                                            const Tensor& weight, const Tensor& bias,
                                            const Pool2dGeometry& g, Tensor& y, Tensor& argmax,
                                            Tensor& mean, Tensor& rstd) {
  // x [N, C, H, W] -> y, argmax [N, C, OH, OW]
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2) * x.size(3), per = c / groups;
  const PlaneShape planes{per, x.size(2), x.size(3), y.size(2), y.size(3)};
  const int64_t pooled = per * planes.oh * planes.ow;  // a group's outputs
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "group_norm_relu_max_pool2d", [&] {
    // 16 bits: the group is normalised and pooled in float, and only the pooled maxima rounded
    using C = compute_t<T>;
    T* out = y.data<T>();
    int32_t* at = argmax.data<int32_t>();
    ThreadScratch<C> values(per, s, compute_dtype(x.dtype()));
    ThreadScratch<C> maxima(1, is_half_v<T> ? pooled : 0, compute_dtype(x.dtype()));
    ThreadScratch<int32_t> scratch(1, max_pool_scratch(planes), DType::kInt32);
    group_norm_groups(
        x.data<T>(), n, c, s, groups, eps, optional_data<T>(weight), optional_data<T>(bias),
        mean.data<C>(), rstd.data<C>(), [&](int64_t) { return values.mine(); },
        [&](int64_t ng, const C* normalised) {
          pool_group(normalised, per, planes, g, scratch.mine(), maxima.mine(), out + ng * pooled,
                     at + ng * pooled);
        });
  });
}

void CpuBackend::group_norm_relu_max_pool2d_backward(const Tensor& dy, const Tensor& argmax,
                                                     const Tensor& x, int64_t groups,
                                                     const Tensor& mean, const Tensor& rstd,
                                                     const Tensor& weight, const Pool2dGeometry& g,
                                                     Tensor& dx, double beta, Tensor& dweight,
                                                     Tensor& dbias) {
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2) * x.size(3), per = c / groups;
  if (s == 1) {
    // 1 x 1 planes: group norm's backward takes its own path there, so spread first, in the
    // compute type (overlapping windows add up there; a 16-bit x's operands are widened for it,
    // and its dx rounded once)
    const DType wide = compute_dtype(x.dtype());
    const auto widened = [&](const Tensor& t) { return in_compute_dtype(*this, t); };
    Tensor spread = Tensor::empty({n, c, 1, 1}, wide, x.device());
    max_pool2d_backward(widened(dy), argmax, spread);
    Tensor dx_wide =  // a scratch for a 16-bit dx, else dx itself
        !dx.defined() || dx.dtype() == wide ? dx : Tensor::empty(dx.shape(), wide, dx.device());
    Tensor dx_ncs = dx_wide.defined() ? dx_wide.view({n, c, 1}) : Tensor();
    group_norm_backward(spread.view({n, c, 1}), widened(x).view({n, c, 1}), groups, mean, rstd,
                        widened(weight), dx_ncs, beta, dweight, dbias);
    if (dx_wide.defined() && dx_wide.dtype() != dx.dtype()) cast(dx_wide, dx);
    return;
  }
  const PlaneShape planes{per, x.size(2), x.size(3), dy.size(2), dy.size(3)};
  const int64_t pooled = per * planes.oh * planes.ow;  // a group's outputs
  const bool two_by_two = pools_2x2(planes, g);
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "group_norm_relu_max_pool2d_backward", [&] {
    // 16 bits: the group's pooled dy is widened, then spread in float
    using C = compute_t<T>;
    const T* pooled_dy = dy.data<T>();
    const int32_t* at = argmax.data<int32_t>();
    ThreadScratch<C> spread(per, s, compute_dtype(x.dtype()));
    ThreadScratch<C> widened(1, is_half_v<T> ? pooled : 0, compute_dtype(x.dtype()));
    group_norm_backward_planes(
        [&](int64_t ng) {
          const C* pooled_grad = in_compute_type(pooled_dy + ng * pooled, pooled, widened.mine());
          C* group_dy = spread.mine();
          max_pool_backward_planes(pooled_grad, at + ng * pooled, per, planes, two_by_two,
                                   group_dy);
          return static_cast<const C*>(group_dy);
        },
        x.data<T>(), n, c, s, groups, mean.data<C>(), rstd.data<C>(), optional_data<T>(weight),
        optional_data<T>(dx), beta, optional_data<C>(dweight), optional_data<C>(dbias));
  });
}

void CpuBackend::batch_norm(const Tensor& x, double eps, double momentum, bool use_running,
                            const Tensor& weight, const Tensor& bias, Tensor& running_mean,
                            Tensor& running_var, Tensor& y, Tensor& mean, Tensor& rstd) {
  // x [N, C, S]; a channel's set is N runs of S elements, C S apart
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2);
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "batch_norm", [&] {
    using C = compute_t<T>;
    const T *in = x.data<T>(), *w = optional_data<T>(weight), *b = optional_data<T>(bias);
    T* out = y.data<T>();
    C *mu = mean.data<C>(), *rs = rstd.data<C>();
    C *rm = optional_data<C>(running_mean), *rv = optional_data<C>(running_var);
    const double count = static_cast<double>(n * s);
    // channel ch's running statistics from its batch statistics
    const auto update_running = [=](int64_t ch, double var) {
      if (momentum >= 0 && rm != nullptr) {
        // The running variance takes the unbiased estimate, as PyTorch's.
        rm[ch] = static_cast<C>((1 - momentum) * double(rm[ch]) + momentum * double(mu[ch]));
        rv[ch] =
            static_cast<C>((1 - momentum) * double(rv[ch]) + momentum * var * count / (count - 1));
      }
    };
    const auto normalise = [=](int64_t ch) {
      const C wk = w ? load(w[ch]) : C(1), bk = b ? load(b[ch]) : C(0);
      // mean and rstd as locals: as far as the compiler knows, out may alias them
      const C m = mu[ch], r = rs[ch];
      const fn::NormApply apply;
      for (int64_t i = 0; i < n; ++i) {
        const T* run = in + (i * c + ch) * s;
        T* result = out + (i * c + ch) * s;
        for (int64_t k = 0; k < s; ++k) result[k] = store<T>(apply(load(run[k]), m, r, wk, bk));
      }
    };
    if (use_running) {  // the running statistics, channel by channel
      for_range(c, n * c * s, [=](int64_t ch) {
        mu[ch] = rm[ch];
        rs[ch] = static_cast<C>(1.0 / std::sqrt(static_cast<double>(rv[ch]) + eps));
        normalise(ch);
      });
      return;
    }
    // two channels a task, their batch statistics side by side
    for_range((c + 1) / 2, n * c * s, [=](int64_t pair) {
      const int64_t ch = 2 * pair;
      if (ch + 1 < c) {
        const auto var =
            statistics(in + ch * s, in + (ch + 1) * s, n, s, c * s, eps, mu + ch, rs + ch);
        update_running(ch, var[0]);
        update_running(ch + 1, var[1]);
        normalise(ch);
        normalise(ch + 1);
      } else {
        update_running(ch, statistics_of_one(in + ch * s, n, s, c * s, eps, mu + ch, rs + ch));
        normalise(ch);
      }
    });
  });
}

void CpuBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, bool use_running,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                     Tensor& dx, double beta, Tensor& dweight, Tensor& dbias) {
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2);
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "batch_norm_backward", [&] {
    using C = compute_t<T>;
    const T *g = dy.data<T>(), *in = x.data<T>(), *w = optional_data<T>(weight);
    const C *mu = mean.data<C>(), *rs = rstd.data<C>();
    T* out = optional_data<T>(dx);
    C *dw = optional_data<C>(dweight), *db = optional_data<C>(dbias);
    const auto stats_of = [=](int64_t, int64_t ch) {
      return std::pair<double, double>(mu[ch], rs[ch]);
    };
    // dx and the affine gradients of a channel in one task, so the second pass over its dy and x
    // finds them in cache (one pass where only the affine gradients are asked for)
    for_range(c, n * c * s, [=](int64_t ch) {
      if (out != nullptr && use_running) {  // constants: dx = dy w rstd
        const C scale = (w ? load(w[ch]) : C(1)) * rs[ch];
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t k = 0; k < s; ++k)
            out[(i * c + ch) * s + k] = store<T>(load(g[(i * c + ch) * s + k]) * scale);
        }
      } else if (out != nullptr) {
        batch_norm_channel_backward(g, in, out, n, c, s, ch, w, mu[ch], rs[ch], beta, dw, db);
        return;
      }
      if (dw != nullptr || db != nullptr) {
        channel_affine_grads(g, in, n, c, s, ch, stats_of, beta, dw, db);
      }
    });
  });
}

}  // namespace accrue::cpu
