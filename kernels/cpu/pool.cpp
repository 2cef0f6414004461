// CPU pooling over NCHW planes, one (sample, channel) plane per iteration: max pooling keeps the
// flat input index of each region's first maximum for its backward, average pooling divides by
// the whole region, padding included (PyTorch's count_include_pad default). With `relu` max
// pooling compares relu(x) tap by tap (max_pool2d_relu: the ReLU's own pass over the full-size
// input, forward and backward, disappears) and writes argmax -1 where the maximum is not
// positive, where relu's gradient is zero; the backward routes nothing from there.
//
// 16-bit tensors (mixed precision) are pooled in float32: the input widened (exactly), the float32
// kernel run, the result rounded once into the 16-bit output (max pooling's values come back
// unchanged; the gradients of overlapping regions are summed in float32 before that rounding).
// Max pooling, the CNN's, widens a task's planes at a time in a thread's scratch; average pooling
// widens whole tensors.
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec.h"
#include "kernels/dispatch.h"
#include "kernels/functors.h"

namespace accrue::cpu {

namespace {

// body(in, out) on in [in_n] and out [out_n] themselves for float and double; for 16-bit T on
// float32 copies in a thread's `wide` scratch (in_n + out_n values), the input widened exactly
// and the output (which body writes whole) rounded into out afterwards.
template <typename T, typename F>
void in_float_or_own(const T* in, int64_t in_n, T* out, int64_t out_n, ThreadScratch<float>& wide,
                     F body) {
  if constexpr (is_half_v<T>) {
    float* wide_in = wide.mine();
    float* wide_out = wide_in + in_n;
    row_to_float(in, wide_in, in_n);
    body(static_cast<const float*>(wide_in), wide_out);
    row_from_float(wide_out, out, out_n);
  } else {
    body(in, out);
  }
}

// An empty float32 tensor of t's shape.
Tensor wide_like(const Tensor& t) {
  return Tensor::empty(t.shape(), DType::kFloat32, Device::cpu());
}

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

// Max pooling 2 x 2 with stride 2 of `count` consecutive planes whose width is even (W = 2 OW,
// pools_2x2), output row by output row, N outputs at a time (kernels/cpu/vec.h): each of the two
// input rows is loaded as 2 N values and split into its even and odd columns, a, b on top and
// c, d below, the taps in region order. The top winner is b where b beats a (the first of the two
// on a tie), likewise below, and the output is the bottom winner where it beats the top one: the
// comparisons of max_pool_plane_inside, so the same maxima and first-maximum indices. A row of at
// least N outputs runs whole vectors, the last one ending at the row's end (overlapping the one
// before: the same values again). Rows of at most N / 2 outputs (7 on MNIST's second layer) run
// two at a time, an input row being one vector, the two rows' even (odd) columns taken by one
// two-vector shuffle. Other narrow rows run one vector. Lanes past the rows land on the next
// rows' outputs, which those rows rewrite right after; a row whose vectors would read or write
// past the planes runs on copies.
using vec::evens;
using vec::kLanes;
using vec::load;
using vec::Mask;
using vec::odds;
using vec::store;
using vec::Vec;

template <bool kRelu, typename V>
V taps(const V& x) {
  if constexpr (kRelu) {
    return vec::greater_else_second(V{}, x);  // tap(): +0 where x < 0, else x (NaN and -0 kept)
  } else {
    return x;
  }
}

// fn::pool_beats lane by lane (v > best or v NaN, where best is not NaN) as !(v <= best), true for
// v > best and wherever either is NaN, where best == best: two comparisons, the second under the
// first's mask on AVX-512.
template <typename V>
auto beats(const V& v, const V& best) {
  return ~(v <= best) & (best == best);
}

// The outputs of N regions: a, b are the top input row's taps of each lane's region (its even
// and odd columns), c, d the bottom row's; columns the plane index of each region's top-left
// input. Stored whole at out and out_at.
template <bool kRelu, typename T, typename V, typename M>
void pool_2x2_lanes(V a, V b, V c, V d, const M& columns, int64_t w, T* out, int32_t* out_at) {
  using Index = std::remove_reference_t<decltype(columns[0])>;
  a = taps<kRelu>(a);
  b = taps<kRelu>(b);
  c = taps<kRelu>(c);
  d = taps<kRelu>(d);
  const M take_b = beats(b, a), take_d = beats(d, c);
  const V upper = take_b ? b : a, lower = take_d ? d : c;
  const M take_lower = beats(lower, upper);
  const V winner = take_lower ? lower : upper;
  // a mask lane is -1 where taken: the odd column is the even one less the mask
  M index = take_lower ? columns + static_cast<Index>(w) - take_d : columns - take_b;
  if constexpr (kRelu) index = winner > V{} ? index : M{} - 1;
  store(out, winner);
  vec::store_int32<T>(out_at, index);
}

// The shuffle that pools two output rows of at most N / 2 outputs in one vector: lanes [0, OW)
// take output row i, lanes [OW, 2 OW) row i + 1, each input row being one vector.
template <typename T, int64_t N>
struct RowPair {
  using M = Mask<T, N>;
  M evens{};       // the shuffle's lanes for the even columns of the two rows (odd: + 1)
  M columns{};     // each lane's column in its plane, less its row's
  M second_row{};  // -1 in lanes [OW, N)
  explicit RowPair(int64_t ow) {
    for (int64_t j = 0; j < N; ++j) {
      const int64_t column = j < 2 * ow ? 2 * (j % ow) : 0;
      evens[j] = static_cast<typename vec::Lanes<T, N>::IndexValue>(j < ow ? column : N + column);
      columns[j] = static_cast<typename vec::Lanes<T, N>::IndexValue>(column);
      second_row[j] = j >= ow ? -1 : 0;
    }
  }
};

// Rows whose vectors would read or write past the planes (the last rows of narrow planes) run on
// copies: each input row in a row of 2 N zeros (lanes past the row feed only outputs that are
// dropped), the valid outputs copied back.
template <typename T, int64_t N>
struct StagedRows {
  T rows[4][2 * N] = {};
  T best[N];
  int32_t at[N];
  const T* stage(const T* row, int64_t w, int k) {
    vec::copy_row(row, w, rows[k]);
    return rows[k];
  }
  void unstage(int64_t outputs, T* out, int32_t* out_at) const {
    std::copy(best, best + outputs, out);
    std::copy(at, at + outputs, out_at);
  }
};

// Output rows i and i + 1 of the planes, whose top-left inputs are top and next_top (at rows row
// and next_row of their planes), into out and out_at (their 2 OW outputs); on copies unless fits.
template <bool kRelu, int64_t N, typename T>
void pool_row_pair(const T* top, const T* next_top, int64_t row, int64_t next_row, int64_t w,
                   int64_t ow, const RowPair<T, N>& pair, bool fits, StagedRows<T, N>& staged,
                   T* out, int32_t* out_at) {
  using V = Vec<T, N>;
  using M = Mask<T, N>;
  using Index = typename vec::Lanes<T, N>::IndexValue;
  const auto input = [&](const T* p, int k) {
    return load<T, N>(fits ? p : staged.stage(p, w, k));
  };
  const V tops[2] = {input(top, 0), input(next_top, 1)};
  const V bottoms[2] = {input(top + w, 2), input(next_top + w, 3)};
  const M columns = pair.columns + (pair.second_row ? M{} + static_cast<Index>(next_row)
                                                    : M{} + static_cast<Index>(row));
  pool_2x2_lanes<kRelu>(__builtin_shuffle(tops[0], tops[1], pair.evens),
                        __builtin_shuffle(tops[0], tops[1], pair.evens + 1),
                        __builtin_shuffle(bottoms[0], bottoms[1], pair.evens),
                        __builtin_shuffle(bottoms[0], bottoms[1], pair.evens + 1), columns, w,
                        fits ? out : staged.best, fits ? out_at : staged.at);
  if (!fits) staged.unstage(2 * ow, out, out_at);
}

// One output row of the planes, whose top-left input is top (at row `row` of its plane), into out
// and out_at (its OW outputs), N at a time; on copies unless fits.
template <bool kRelu, int64_t N, typename T>
void pool_row(const T* top, int64_t row, int64_t w, int64_t ow, bool fits, StagedRows<T, N>& staged,
              T* out, int32_t* out_at) {
  using V = Vec<T, N>;
  using Index = typename vec::Lanes<T, N>::IndexValue;
  const T* top_row = fits ? top : staged.stage(top, w, 0);
  const T* bottom_row = fits ? top + w : staged.stage(top + w, w, 1);
  for (int64_t j = 0;; j += N) {
    const int64_t first = ow >= N ? std::min(j, ow - N) : 0;
    const T *p = top_row + 2 * first, *q = bottom_row + 2 * first;
    const V top_lo = load<T, N>(p), top_hi = load<T, N>(p + N);
    const V bottom_lo = load<T, N>(q), bottom_hi = load<T, N>(q + N);
    pool_2x2_lanes<kRelu>(evens<T, N>(top_lo, top_hi), odds<T, N>(top_lo, top_hi),
                          evens<T, N>(bottom_lo, bottom_hi), odds<T, N>(bottom_lo, bottom_hi),
                          vec::strided<Mask<T, N>, 0, 2>() + static_cast<Index>(row + 2 * first), w,
                          fits ? out + first : staged.best, fits ? out_at + first : staged.at);
    if (first + N >= ow) break;
  }
  if (!fits) staged.unstage(ow, out, out_at);
}

template <bool kRelu, int64_t N, typename T>
void max_pool_planes_2x2(const T* __restrict planes, int64_t count, const PlaneShape& s,
                         T* __restrict best, int32_t* __restrict at) {
  const int64_t ow = s.ow, rows = count * s.oh, end = count * s.h * s.w, area = s.h * s.w;
  const bool paired = 2 * ow <= N;
  const RowPair<T, N> pair(paired ? ow : 0);
  StagedRows<T, N> staged;
  // output row i is row `oh` of plane `plane`
  for (int64_t i = 0, plane = 0, oh = 0; i < rows;) {
    const int64_t row = 2 * oh * s.w;
    const T* top = planes + plane * area + row;
    const int64_t step = paired && i + 1 < rows ? 2 : 1;  // output rows this step
    if (step == 2) {
      const bool last = oh + 1 == s.oh;  // the next row is the next plane's first
      const int64_t next_row = last ? 0 : row + 2 * s.w;
      const T* next_top = planes + (last ? plane + 1 : plane) * area + next_row;
      const bool fits = next_top - planes + s.w + N <= end && i * ow + N <= rows * ow;
      pool_row_pair<kRelu>(top, next_top, row, next_row, s.w, ow, pair, fits, staged, best + i * ow,
                           at + i * ow);
    } else {
      const bool fits = ow >= N || (top - planes + s.w + 2 * N <= end && i * ow + N <= rows * ow);
      pool_row<kRelu>(top, row, s.w, ow, fits, staged, best + i * ow, at + i * ow);
    }
    for (int64_t k = 0; k < step; ++k, ++i) {
      if (++oh == s.oh) oh = 0, ++plane;
    }
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
                          int32_t* scratch, T* out, int32_t* at) {
  const int64_t n = s.oh * s.ow;
  if (n == 0) return;
  const bool inside = g.pad_h == 0 && g.pad_w == 0 && (s.oh - 1) * g.stride_h + g.kernel_h <= s.h &&
                      (s.ow - 1) * g.stride_w + g.kernel_w <= s.w;
  if (pools_2x2(s, g)) {
    // float rows run 16 lanes (two rows of at most 8 outputs, or 16 outputs of one row; 14 and 7
    // on MNIST): one AVX-512 register, or two AVX2 ones (the same instructions as two vectors of 8)
    if (sizeof(T) == 4) {
      max_pool_planes_2x2<kRelu, 2 * vec::kLanes>(in, count, s, out, at);
    } else {
      max_pool_planes_2x2<kRelu, vec::kLanes>(in, count, s, out, at);
    }
    return;
  }
  if (inside) {
    int32_t* starts = scratch;
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

int64_t max_pool_scratch(const PlaneShape& s) {
  return s.oh * s.ow;
}

template <typename T>
void max_pool_planes(const T* in, int64_t count, const PlaneShape& s, const Pool2dGeometry& g,
                     bool relu, int32_t* scratch, T* y, int32_t* argmax) {
  if (relu) {
    max_pool_some_planes<true>(in, count, s, g, scratch, y, argmax);
  } else {
    max_pool_some_planes<false>(in, count, s, g, scratch, y, argmax);
  }
}

namespace {

// dx [H, W] of one plane whose width is 2 OW and height at least 2 OH, when each output routes to
// its own 2 x 2 cell (input rows 2 oh and 2 oh + 1, columns 2 ow and 2 ow + 1) or nowhere (-1): an
// input is then 0 + dy of the output naming it, else +0, the values of max_pool_backward_planes'
// adds in order (an input takes one add at most, and a +0 added to an input changes nothing: its
// value is never -0). Written output row by output row, N outputs a step: the four taps' values as
// selects of dy, zipped into the cell's two input rows (no fill, no scatter); narrow rows go
// through local copies, and the rows below 2 OH are zeros. Returns false when an output routes
// anywhere else, dx then being partly written.
template <int64_t N, typename T>
bool spread_to_own_cells(const T* dy, const int32_t* at, const PlaneShape& s, T* dx) {
  using V = Vec<T, N>;
  using M = Mask<T, N>;
  using Index = typename vec::Lanes<T, N>::IndexValue;
  const M lane = vec::strided<M, 0, 1>();
  const int64_t ow = s.ow, w = s.w;
  const bool narrow = ow < N;
  const Index width = static_cast<Index>(w);
  T dy_row[N] = {}, top_row[2 * N], bottom_row[2 * N];
  int32_t at_row[N];
  std::fill(at_row, at_row + N, -1);  // lanes past a narrow row route nowhere
  M strays{};                         // -1 in the lanes of outputs that route outside their cell
  for (int64_t oh = 0; oh < s.oh; ++oh) {
    const T* g_in = dy + oh * ow;
    const int32_t* at_in = at + oh * ow;
    T *top = dx + 2 * oh * w, *bottom = top + w;
    if (narrow) {
      std::copy(g_in, g_in + ow, dy_row);
      std::copy(at_in, at_in + ow, at_row);
    }
    for (int64_t j = 0;; j += N) {
      const int64_t first =
          narrow ? 0 : std::min(j, ow - N);  // the last block ends at the row's end
      const V g = T(0) + load<T, N>(narrow ? dy_row : g_in + first);
      const M a = vec::load_int32<T, N>(narrow ? at_row : at_in + first);
      const M corner = lane * 2 + static_cast<Index>(2 * oh * w + 2 * first);  // top left
      const M top_left = a == corner, top_right = a == corner + 1;
      const M bottom_left = a == corner + width, bottom_right = a == corner + width + 1;
      strays |= ~(top_left | top_right | bottom_left | bottom_right | (a == -1));
      const V tl = top_left ? g : V{}, tr = top_right ? g : V{};
      const V bl = bottom_left ? g : V{}, br = bottom_right ? g : V{};
      T* t = narrow ? top_row : top + 2 * first;
      T* b = narrow ? bottom_row : bottom + 2 * first;
      store(t, vec::zip_low<T, N>(tl, tr));
      store(t + N, vec::zip_high<T, N>(tl, tr));
      store(b, vec::zip_low<T, N>(bl, br));
      store(b + N, vec::zip_high<T, N>(bl, br));
      if (narrow) {
        vec::copy_row(top_row, 2 * ow, top);
        vec::copy_row(bottom_row, 2 * ow, bottom);
      }
      if (narrow || first + N >= ow) break;
    }
  }
  std::fill(dx + 2 * s.oh * w, dx + s.h * w, T(0));
  for (int64_t i = 0; i < N; ++i) {
    if (strays[i]) return false;
  }
  return true;
}

// spread_to_own_cells with the widest vectors the rows fill: 8 outputs a step, or 4 for rows of 4
// to 7 outputs (7 on MNIST's second layer), whose local copies would cost more than the spread.
template <typename T>
bool spread_to_own_cells(const T* dy, const int32_t* at, const PlaneShape& s, T* dx) {
  return s.ow >= kLanes ? spread_to_own_cells<kLanes>(dy, at, s, dx)
                        : spread_to_own_cells<kLanes / 2>(dy, at, s, dx);
}

// Whether each output of the planes has a 2 x 2 cell of its own (input rows 2 oh and 2 oh + 1,
// columns 2 ow and 2 ow + 1) and the cells cover every column.
bool has_own_cells(const PlaneShape& s) {
  return s.w == 2 * s.ow && s.h >= 2 * s.oh;
}

}  // namespace

bool pools_2x2(const PlaneShape& s, const Pool2dGeometry& g) {
  return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
         g.pad_w == 0 && has_own_cells(s);
}

template <typename T>
void max_pool_backward_planes(const T* dy, const int32_t* argmax, int64_t count,
                              const PlaneShape& s, bool disjoint, T* dx) {
  const int64_t area = s.h * s.w, outputs = s.oh * s.ow;
  // The spread wherever the outputs may route to their own cells, except where the regions are
  // known disjoint and a row has fewer outputs than a vector has lanes: the spread then runs
  // half-width vectors, and the fill and scatter below measured faster (the fused group norm's
  // 14 x 14 planes; at 28 x 28 the spread is the faster).
  const bool spread = has_own_cells(s) && (!disjoint || s.ow >= kLanes);
  for (int64_t p = 0; p < count; ++p) {
    T* plane = dx + p * area;
    const T* grad = dy + p * outputs;
    const int32_t* at = argmax + p * outputs;
    if (spread && spread_to_own_cells(grad, at, s, plane)) continue;
    std::fill(plane, plane + area, T(0));
    if (!disjoint) {
      // No branch on argmax -1 (max_pool2d_relu's, about half the outputs in training, so a
      // branch mispredicts): such an output adds +0 to the input at its own index (clamped to the
      // plane; spread out, so the adds do not queue on one address), which keeps every bit: the
      // plane's values start at +0 and a sum never turns into -0.
      for (int64_t o = 0; o < outputs; ++o) {
        const bool routed_here = at[o] >= 0;
        const int64_t target = routed_here ? at[o] : std::min(o, area - 1);
        plane[target] += kept_or_zero(routed_here, grad[o]);
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
                              int32_t*, float*, int32_t*);
template void max_pool_planes(const double*, int64_t, const PlaneShape&, const Pool2dGeometry&,
                              bool, int32_t*, double*, int32_t*);
template void max_pool_backward_planes(const float*, const int32_t*, int64_t, const PlaneShape&,
                                       bool, float*);
template void max_pool_backward_planes(const double*, const int32_t*, int64_t, const PlaneShape&,
                                       bool, double*);

void CpuBackend::max_pool2d(const Tensor& x, const Pool2dGeometry& g, bool relu, Tensor& y,
                            Tensor& argmax) {
  const PlaneShape s = plane_shape(x, y);
  constexpr int64_t group = 8;  // planes per task
  const int64_t n = s.oh * s.ow;
  ACCRUE_DISPATCH_FLOATING_AND_HALF(x.dtype(), "max_pool2d", [&] {
    const T* in = x.data<T>();
    T* out = y.data<T>();
    int32_t* at = argmax.data<int32_t>();
    ThreadScratch<int32_t> scratch(1, max_pool_scratch(s), DType::kInt32);
    ThreadScratch<float> wide(1, is_half_v<T> ? group * (s.h * s.w + n) : 0, DType::kFloat32);
    for_range((s.planes + group - 1) / group, s.planes * s.h * s.w, [&](int64_t task) {
      const int64_t p = task * group, count = std::min(group, s.planes - p);
      in_float_or_own(in + p * s.h * s.w, count * s.h * s.w, out + p * n, count * n, wide,
                      [&](const auto* planes, auto* pooled) {
                        max_pool_planes(planes, count, s, g, relu, scratch.mine(), pooled,
                                        at + p * n);
                      });
    });
  });
}

void CpuBackend::max_pool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  // dx [planes, H W] = 0, then dx[argmax] += dy where argmax >= 0, plane by plane
  // (max_pool_backward_planes). No geometry here: the regions may overlap.
  const PlaneShape s = plane_shape(dx, dy);
  const int64_t planes = s.planes, area = s.h * s.w, outputs = s.oh * s.ow;
  ACCRUE_DISPATCH_FLOATING_AND_HALF(dy.dtype(), "max_pool2d_backward", [&] {
    const T* grad = dy.data<T>();
    const int32_t* at = argmax.data<int32_t>();
    T* out = dx.data<T>();
    ThreadScratch<float> wide(1, is_half_v<T> ? outputs + area : 0, DType::kFloat32);
    for_range(planes, planes * (area + outputs), [&](int64_t p) {
      in_float_or_own(grad + p * outputs, outputs, out + p * area, area, wide,
                      [&](const auto* dy_plane, auto* dx_plane) {
                        max_pool_backward_planes(dy_plane, at + p * outputs, 1, s, false, dx_plane);
                      });
    });
  });
}

void CpuBackend::avg_pool2d(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  if (is_half(x.dtype())) {
    Tensor wide = wide_like(y);
    avg_pool2d(in_compute_dtype(*this, x), g, wide);
    return cast(wide, y);
  }
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
  if (is_half(dy.dtype())) {
    Tensor wide = wide_like(dx);
    avg_pool2d_backward(in_compute_dtype(*this, dy), g, wide);
    return cast(wide, dx);
  }
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
