// CPU Winograd F(2x2, 3x3) convolution (Lavin and Gray, 2015), NCHW, 3x3 filters at stride 1.
// Each 2x2 output tile reads a 4x4 input tile d; with the constant matrices B, G and A below,
//   y = A^T [ (G g G^T) (.) (B^T d B) ] A
// so the 36 multiplications of a tile and channel pair become 16 element-wise products, and summed
// over the input channels those are 16 GEMMs: for each of the 16 positions xi of the 4x4 tile,
//   M[xi] [O, tiles] = U[xi] [O, C] @ V[xi] [C, tiles].
// The data gradient is the same machinery: the forward convolution of dy with the filters flipped
// and their channels swapped (padding 2 - pad). The filter gradient stays with im2col (conv.h says
// why).
//
// Samples go in chunks fixed by the shape (the transformed tiles of a chunk sized to stay in the
// cache), each chunk on one thread with single-threaded BLAS calls, so results do not depend on
// the thread count.
//
// The input transform goes along each padded row first, then combines rows over all of a sample's
// tiles in one unit-stride loop, which the compiler vectorises.
#include <algorithm>

#include "core/tensor.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/gemm_cut.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"

namespace accrue::cpu::winograd {

namespace {

constexpr int64_t kPositions = 16;  // of a 4x4 tile: the number of GEMMs

// The transformed tiles of one chunk (input and output sides) stay within this many bytes.
constexpr int64_t kChunkBytes = int64_t{1} << 22;
// The chunk count is a multiple of this (when there are enough samples), so teams of 2, 4 and 8
// threads share the chunks evenly.
constexpr int64_t kChunkMultiple = 8;

// A sample's 2x2 output tiles, th x tw of them.
struct Tiling {
  int64_t th, tw;
  int64_t per_sample() const { return th * tw; }
  int64_t input_row() const { return 2 * tw + 2; }  // the tiles' reach along a padded input row
};
Tiling tiling(const ConvShape& s) {
  return {(s.oh + 1) / 2, (s.ow + 1) / 2};
}

struct Chunks {
  int64_t samples, count;  // samples per chunk (the last may hold fewer), chunks
  int64_t first(int64_t chunk) const { return chunk * samples; }
  int64_t end(int64_t chunk, int64_t n) const { return std::min(n, (chunk + 1) * samples); }
};
Chunks chunks(const ConvShape& s, const Tiling& tiles, int64_t element_bytes) {
  const int64_t bytes = s.n * kPositions * (s.c + s.o) * tiles.per_sample() * element_bytes;
  int64_t count = std::max<int64_t>(1, (bytes + kChunkBytes - 1) / kChunkBytes);
  count = std::min(s.n, (count + kChunkMultiple - 1) / kChunkMultiple * kChunkMultiple);
  const int64_t samples = (s.n + count - 1) / count;
  return {samples, (s.n + samples - 1) / samples};
}

// U [16, outs, ins] = G g G^T for each filter g = filter(out, in) (a pointer to 3x3 values read
// as g[i * 3 + j] through at(g, i, j)), G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1].
template <typename T, typename Filter>
void transform_filters(int64_t outs, int64_t ins, Filter filter, T* u) {
  for (int64_t out = 0; out < outs; ++out) {
    for (int64_t in = 0; in < ins; ++in) {
      T gg[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        const T g0 = filter(out, in, 0, j), g1 = filter(out, in, 1, j), g2 = filter(out, in, 2, j);
        gg[0][j] = g0;
        gg[1][j] = T(0.5) * (g0 + g1 + g2);
        gg[2][j] = T(0.5) * (g0 - g1 + g2);
        gg[3][j] = g2;
      }
      for (int i = 0; i < 4; ++i) {
        const T row[4] = {gg[i][0], T(0.5) * (gg[i][0] + gg[i][1] + gg[i][2]),
                          T(0.5) * (gg[i][0] - gg[i][1] + gg[i][2]), gg[i][2]};
        for (int j = 0; j < 4; ++j) u[((i * 4 + j) * outs + out) * ins + in] = row[j];
      }
    }
  }
}

// The scratch input_tiles needs: one padded input row, and the B-transformed columns of the
// 2 th + 2 rows the tiles read (4 per row, even and odd rows apart); output_tiles needs less
// (8 th tw + 2 tw).
int64_t input_scratch(const Tiling& tiles) {
  return tiles.input_row() + 8 * (tiles.th + 1) * tiles.tw;
}

// p B for each tile along one padded row p: the tiles' 4 columns c0 ... c3, tw of each. The
// restrict-qualified pointers let the compiler vectorise (they never overlap).
template <typename T>
void along_row(const T* __restrict p, int64_t tw, T* __restrict c0, T* __restrict c1,
               T* __restrict c2, T* __restrict c3) {
  for (int64_t tx = 0; tx < tw; ++tx) {
    c0[tx] = p[2 * tx] - p[2 * tx + 2];
    c1[tx] = p[2 * tx + 1] + p[2 * tx + 2];
    c2[tx] = p[2 * tx + 2] - p[2 * tx + 1];
    c3[tx] = p[2 * tx + 1] - p[2 * tx + 3];
  }
}

// B^T over rows: tile t (row ty) reads the even rows e[t], e[t + tw] (rows 2 ty, 2 ty + 2) and
// the odd rows o[t], o[t + tw] (rows 2 ty + 1, 2 ty + 3).
template <typename T>
void across_rows(const T* __restrict e, const T* __restrict o, int64_t tw, int64_t count,
                 T* __restrict d0, T* __restrict d1, T* __restrict d2, T* __restrict d3) {
  for (int64_t t = 0; t < count; ++t) {
    d0[t] = e[t] - e[t + tw];
    d1[t] = o[t] + e[t + tw];
    d2[t] = e[t + tw] - o[t];
    d3[t] = o[t] - o[t + tw];
  }
}

// V [16, C, ld] columns t0 ... of one sample x [C, H, W]: B^T d B for each tile d, with
// B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]. B first goes along each padded input row (the
// tiles' columns); B^T then combines rows 2 ty ... 2 ty + 3 of those, which with the even and odd
// rows stored apart is one unit-stride loop over all of the sample's tiles.
template <typename T>
void input_tiles(const T* x, const ConvShape& s, const Conv2dGeometry& g, const Tiling& tiles,
                 int64_t ld, int64_t t0, T* scratch, T* v) {
  const int64_t width = tiles.input_row(), tw = tiles.tw, count = tiles.per_sample();
  const int64_t half = (tiles.th + 1) * tw;  // transformed columns of the even (or odd) rows
  T* padded = scratch;
  T* even[4];
  T* odd[4];
  for (int k = 0; k < 4; ++k) {
    even[k] = scratch + width + 2 * k * half;
    odd[k] = even[k] + half;
  }
  std::fill(padded, padded + width, T(0));
  for (int64_t c = 0; c < s.c; ++c) {
    const T* plane = x + c * s.h * s.w;
    for (int64_t r = 0; r < 2 * tiles.th + 2; ++r) {  // B along each row: p B per tile
      const int64_t ih = r - g.pad_h;
      const bool inside = ih >= 0 && ih < s.h;
      if (inside) std::copy(plane + ih * s.w, plane + (ih + 1) * s.w, padded + g.pad_w);
      T* const* out = r % 2 == 0 ? even : odd;
      const int64_t at = (r / 2) * tw;
      along_row(padded, tw, out[0] + at, out[1] + at, out[2] + at, out[3] + at);
      if (inside) std::fill(padded + g.pad_w, padded + g.pad_w + s.w, T(0));
    }
    for (int k = 0; k < 4; ++k) {  // B^T over the rows: tile ty reads even/odd rows ty, ty + 1
      const T* e = even[k];
      const T* o = odd[k];
      T* out0 = v + (k * s.c + c) * ld + t0;
      T* out1 = out0 + 4 * s.c * ld;
      T* out2 = out1 + 4 * s.c * ld;
      T* out3 = out2 + 4 * s.c * ld;
      across_rows(e, o, tw, count, out0, out1, out2, out3);
    }
  }
}

// A^T over the rows of tiles: for one of the tile's columns, s0 = m0 + m1 + m2 and
// s1 = m1 - m2 - m3 (m0 ... m3 its 4 rows), over count tiles.
template <typename T>
void outputs_across_rows(const T* __restrict m0, const T* __restrict m1, const T* __restrict m2,
                         const T* __restrict m3, int64_t count, T* __restrict s0,
                         T* __restrict s1) {
  for (int64_t t = 0; t < count; ++t) {
    s0[t] = m0[t] + m1[t] + m2[t];
    s1[t] = m1[t] - m2[t] - m3[t];
  }
}

// A along one output row: tile tx's columns q0 ... q3 give out[2 tx] = b + q0 + q1 + q2 and
// out[2 tx + 1] = b + q1 - q2 - q3.
template <typename T>
void outputs_along_row(const T* __restrict q0, const T* __restrict q1, const T* __restrict q2,
                       const T* __restrict q3, int64_t tw, T b, T* __restrict out) {
  for (int64_t tx = 0; tx < tw; ++tx) {
    out[2 * tx] = b + (q0[tx] + q1[tx] + q2[tx]);
    out[2 * tx + 1] = b + (q1[tx] - q2[tx] - q3[tx]);
  }
}

// One sample's y [O, OH, OW] = bias + A^T m A for each tile's m (from M [16, O, ld], columns
// t0 ...), A^T = [1 1 1 0; 0 1 -1 -1]; edge tiles clipped. As in input_tiles, the rows are
// combined first over all of the sample's tiles, then each output row pair is written.
// scratch: input_scratch.
template <typename T>
void output_tiles(const T* m, const ConvShape& s, const Tiling& tiles, int64_t ld, int64_t t0,
                  const T* bias, T* scratch, T* y) {
  const int64_t tw = tiles.tw, count = tiles.per_sample();
  T* top[4];     // s0 of each tile column: the tiles' top output rows, before A
  T* bottom[4];  // s1: their bottom rows
  for (int k = 0; k < 4; ++k) {
    top[k] = scratch + 2 * k * count;
    bottom[k] = top[k] + count;
  }
  T* row = scratch + 8 * count;  // one output row, 2 tw
  for (int64_t o = 0; o < s.o; ++o) {
    const T b = bias ? bias[o] : T(0);
    for (int k = 0; k < 4; ++k) {
      const T* m0 = m + (k * s.o + o) * ld + t0;
      const int64_t next = 4 * s.o * ld;  // from tile row a to a + 1
      outputs_across_rows(m0, m0 + next, m0 + 2 * next, m0 + 3 * next, count, top[k], bottom[k]);
    }
    T* plane = y + o * s.oh * s.ow;
    for (int64_t ty = 0; ty < tiles.th; ++ty) {
      const int64_t at = ty * tw;
      outputs_along_row(top[0] + at, top[1] + at, top[2] + at, top[3] + at, tw, b, row);
      std::copy(row, row + s.ow, plane + 2 * ty * s.ow);
      if (2 * ty + 1 < s.oh) {
        outputs_along_row(bottom[0] + at, bottom[1] + at, bottom[2] + at, bottom[3] + at, tw, b,
                          row);
        std::copy(row, row + s.ow, plane + (2 * ty + 1) * s.ow);
      }
    }
  }
}

void check_blas_sizes(const ConvShape& s, const Chunks& chunks, const Tiling& tiles,
                      const char* op) {
  blas_int(s.o, op, "out channels");
  blas_int(s.c, op, "in channels");
  blas_int(chunks.samples * tiles.per_sample(), op, "tiles per chunk");
}

// y [N, O, OH, OW] = bias + the convolution of x [N, C, H, W] with the filters whose transforms
// are u [16, O, C].
template <typename T>
void convolve(const T* x, const T* u, const T* bias, const ConvShape& s, const Conv2dGeometry& g,
              DType dtype, T* y, const char* op) {
  const Tiling tiles = tiling(s);
  const Chunks ch = chunks(s, tiles, sizeof(T));
  check_blas_sizes(s, ch, tiles, op);
  const int64_t most = ch.samples * tiles.per_sample();  // tiles of the largest chunk
  const int64_t v_size = kPositions * s.c * most, m_size = kPositions * s.o * most;
  ThreadScratch<T> scratch(1, v_size + m_size + input_scratch(tiles), dtype);
  for_library_calls(ch.count, s.macs() >= kParallelMacs, [&](int64_t chunk) {
    T* v = scratch.mine();
    T* m = v + v_size;
    T* rows = m + m_size;
    const int64_t first = ch.first(chunk), end = ch.end(chunk, s.n);
    const int64_t ld = (end - first) * tiles.per_sample();
    for (int64_t n = first; n < end; ++n) {
      input_tiles(x + n * s.image(), s, g, tiles, ld, (n - first) * tiles.per_sample(), rows, v);
    }
    for (int64_t xi = 0; xi < kPositions; ++xi) {
      blas(CblasNoTrans, CblasNoTrans, int(s.o), int(ld), int(s.c), T(1), u + xi * s.o * s.c,
           int(s.c), v + xi * s.c * ld, int(ld), T(0), m + xi * s.o * ld, int(ld));
    }
    for (int64_t n = first; n < end; ++n) {
      output_tiles(m, s, tiles, ld, (n - first) * tiles.per_sample(), bias, rows,
                   y + n * s.output());
    }
  });
}

}  // namespace

template <typename T>
void forward(const T* x, const T* w, const T* bias, const ConvShape& s, const Conv2dGeometry& g,
             DType dtype, T* y) {
  // x [N, C, H, W], w [O, C, 3, 3] -> y [N, O, OH, OW]
  Tensor u = Tensor::empty({kPositions, s.o, s.c}, dtype, Device::cpu());
  transform_filters(
      s.o, s.c,
      [=](int64_t o, int64_t c, int i, int j) { return w[((o * s.c + c) * 3 + i) * 3 + j]; },
      u.data<T>());
  convolve(x, u.data<T>(), bias, s, g, dtype, y, "conv2d");
}

template <typename T>
void backward_data(const T* dy, const T* w, const ConvShape& s, const Conv2dGeometry& g,
                   DType dtype, T* dx) {
  // dx [N, C, H, W] = dy [N, O, OH, OW] convolved with w [O, C, 3, 3] flipped as [C, O, 3, 3]
  const ConvShape flipped{s.n, s.o, s.oh, s.ow, s.c, 3, 3, s.h, s.w};
  Conv2dGeometry full = g;
  full.pad_h = 2 - g.pad_h;
  full.pad_w = 2 - g.pad_w;
  Tensor u = Tensor::empty({kPositions, s.c, s.o}, dtype, Device::cpu());
  transform_filters(
      s.c, s.o,
      [=](int64_t c, int64_t o, int i, int j) {
        return w[((o * s.c + c) * 3 + (2 - i)) * 3 + (2 - j)];
      },
      u.data<T>());
  convolve(dy, u.data<T>(), static_cast<const T*>(nullptr), flipped, full, dtype, dx,
           "conv2d_backward_data");
}

#define ACCRUE_WINOGRAD_INSTANTIATE(T)                                                            \
  template void forward<T>(const T*, const T*, const T*, const ConvShape&, const Conv2dGeometry&, \
                           DType, T*);                                                            \
  template void backward_data<T>(const T*, const T*, const ConvShape&, const Conv2dGeometry&,     \
                                 DType, T*);
ACCRUE_WINOGRAD_INSTANTIATE(float)
ACCRUE_WINOGRAD_INSTANTIATE(double)
#undef ACCRUE_WINOGRAD_INSTANTIATE

}  // namespace accrue::cpu::winograd
