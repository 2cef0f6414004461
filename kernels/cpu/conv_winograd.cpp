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
// The input transform goes along each padded row first, a tile row's tiles in vector lanes, then
// across the rows in one unit-stride loop over a sample's tiles (input_tiles). A channel's 16 rows
// of V, every sample's tiles, are assembled in a buffer of 16 ld values (a channel's share of V)
// and copied out whole. Measured at conv2's shapes (bench rows, the same bytes): storing each tile
// row's vector straight into V's 16 rows instead ran the forward at 667-727 us against 612-630,
// the data gradient at 806-850 against 670-692. These ran no faster than that: the same two
// passes storing into V in place (though 20-28% faster in a harness where V stays in L2), a
// sample's padded channels all copied before the first transform, V laid out [C, 16, tiles] with
// the GEMMs reading it 16 rows apart, a prefetch-for-write of V's next lines, chunks of 2 samples.
#include <algorithm>

#include "core/tensor.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/gemm_cut.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec.h"

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
  int64_t padded_rows() const { return 2 * th + 2; }  // the input rows the tiles read
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

// U [16, outs, ins] = G g G^T for each filter g, its values g[i][j] = filter(out, in, i, j),
// G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]. Each call transforms every filter (the weights
// change between calls), the outs shared out over the threads. The filters of a block of ins are
// first gathered value by value, so the transform runs a vector of filters at once with
// unit-stride loads and stores (the same formulas for each filter).
template <typename T, typename Filter>
void transform_filters(int64_t outs, int64_t ins, Filter filter, T* u) {
  constexpr int64_t kBlock = 64;  // ins per gathered block
  for_range(outs, outs * ins * (9 + kPositions), [=](int64_t out) {
    for (int64_t in0 = 0; in0 < ins; in0 += kBlock) {
      const int64_t count = std::min(kBlock, ins - in0);
      T g[9][kBlock];  // g[3 i + j][k]: filter(out, in0 + k, i, j)
      for (int64_t k = 0; k < count; ++k) {
        for (int e = 0; e < 9; ++e) g[e][k] = filter(out, in0 + k, e / 3, e % 3);
      }
      T* at = u + out * ins + in0;
#pragma omp simd
      for (int64_t k = 0; k < count; ++k) {
        T gg[4][3];  // G g
        for (int j = 0; j < 3; ++j) {
          const T g0 = g[j][k], g1 = g[3 + j][k], g2 = g[6 + j][k];
          gg[0][j] = g0;
          gg[1][j] = T(0.5) * (g0 + g1 + g2);
          gg[2][j] = T(0.5) * (g0 - g1 + g2);
          gg[3][j] = g2;
        }
        for (int i = 0; i < 4; ++i) {
          const T row[4] = {gg[i][0], T(0.5) * (gg[i][0] + gg[i][1] + gg[i][2]),
                            T(0.5) * (gg[i][0] - gg[i][1] + gg[i][2]), gg[i][2]};
          for (int j = 0; j < 4; ++j) at[(i * 4 + j) * outs * ins + k] = row[j];
        }
      }
    }
  });
}

// The transforms' passes along rows run on kLanes tiles of a tile row at once (kernels/cpu/vec.h;
// a row of the MNIST CNN's 14 x 14 planes is 7 tiles: one vector). Each value is the same sums in
// the same order as the scalar formulas in the comments, so the results are those of a loop over
// single tiles; only the loads, shuffles and stores are grouped.
using vec::copy_row;
using vec::evens;
using vec::kLanes;
using vec::Lanes;
using vec::load;
using vec::odds;
using vec::store;
using vec::Vec;

// The blocks of kLanes tiles a tile row is cut into (the last may hold fewer).
int64_t lane_blocks(const Tiling& tiles) {
  return (tiles.tw + kLanes - 1) / kLanes;
}
// One channel of the input inside its zero padding: 2 th + 2 rows, each wide enough for every
// block's loads (2 kLanes + 2 values from column 2 kLanes block).
int64_t padded_stride(const Tiling& tiles) {
  return 2 * kLanes * lane_blocks(tiles) + kLanes;
}
// One of input_tiles' eight row buffers: the B-transformed column ck of the even (or odd) padded
// rows, th + 1 rows of tw tiles back to back, and room for the last block's lanes past them.
int64_t row_buffer(const Tiling& tiles) {
  return (tiles.th + 1) * tiles.tw + kLanes;
}
// The scratch input_tiles needs for ld tiles: the padded channel, its eight row buffers and a
// channel's 16 rows of V; output_tiles needs less (2 vectors per block).
int64_t input_scratch(const Tiling& tiles, int64_t ld) {
  return tiles.padded_rows() * padded_stride(tiles) + 8 * row_buffer(tiles) + kPositions * ld;
}

// V [16, C, ld] = B^T d B for each tile d of the samples x [samples, C, H, W] (ld of their tiles,
// sample by sample), with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]. B first goes along each
// padded input row r: for tile column tx (p = the row),
//   c0 = p[2 tx] - p[2 tx + 2], c1 = p[2 tx + 1] + p[2 tx + 2],
//   c2 = p[2 tx + 2] - p[2 tx + 1], c3 = p[2 tx + 1] - p[2 tx + 3];
// then B^T across the rows 2 ty ... 2 ty + 3 (r0 ... r3) of tile row ty, for each column ck:
//   d0 = r0 - r2, d1 = r1 + r2, d2 = r2 - r1, d3 = r1 - r3,
// and dl of column ck is the tile's position 4 l + k. A row's ck for a block of tiles come from the
// even and odd columns of the padded row as vectors, and go to the row buffer of ck and the row's
// parity at row r / 2 (a vector's lanes past the row land on the rows after it, written later, or
// past the last row in the buffer's slack).
// Then tile j = ty tw + tx reads r0 (r2) at j (j + tw) of the even rows' buffer and r1 (r3) of the
// odd rows': the second pass is one unit-stride loop over a sample's tiles. A channel's 16 rows of
// V are assembled, every sample's tiles, in the scratch and then copied out a whole row at a time,
// so each line of V is written in one go, front to back (see the top of the file).
template <typename T>
void input_tiles(const T* x, int64_t samples, const ConvShape& s, const Conv2dGeometry& g,
                 const Tiling& tiles, int64_t ld, T* scratch, T* v) {
  const int64_t rows = tiles.padded_rows(), stride = padded_stride(tiles),
                blocks = lane_blocks(tiles), buffer = row_buffer(tiles), tw = tiles.tw;
  T* padded = scratch;
  T* ck_rows = padded + rows * stride;     // [parity, k] row buffers
  T* channel_rows = ck_rows + 8 * buffer;  // [16, ld]: a channel's rows of V
  std::fill(padded, padded + rows * stride, T(0));
  for (int64_t c = 0; c < s.c; ++c) {
    for (int64_t n = 0; n < samples; ++n) {
      const T* plane = x + n * s.image() + c * s.h * s.w;
      for (int64_t ih = 0; ih < s.h; ++ih) {
        copy_row(plane + ih * s.w, s.w, padded + (ih + g.pad_h) * stride + g.pad_w);
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* row = ck_rows + (r % 2) * 4 * buffer + r / 2 * tw;
        for (int64_t block = 0; block < blocks; ++block) {  // p B along row r
          const T* p = padded + r * stride + 2 * kLanes * block;
          const Vec<T> lo = load(p), hi = load(p + kLanes);            // columns 2 tx, 2 tx + 1
          const Vec<T> lo2 = load(p + 2), hi2 = load(p + kLanes + 2);  // 2 tx + 2, 2 tx + 3
          const Vec<T> p0 = evens<T>(lo, hi), p1 = odds<T>(lo, hi), p2 = evens<T>(lo2, hi2),
                       p3 = odds<T>(lo2, hi2);
          T* at = row + block * kLanes;
          store(at, p0 - p2);
          store(at + buffer, p1 + p2);
          store(at + 2 * buffer, p2 - p1);
          store(at + 3 * buffer, p1 - p3);
        }
      }
      for (int k = 0; k < 4; ++k) {  // B^T across the rows of every tile
        const T* __restrict even = ck_rows + k * buffer;
        const T* __restrict odd = even + 4 * buffer;
        T* __restrict d0 = channel_rows + k * ld + n * tiles.per_sample();
        T* __restrict d1 = d0 + 4 * ld;  // position 4 + k
        T* __restrict d2 = d1 + 4 * ld;
        T* __restrict d3 = d2 + 4 * ld;
#pragma omp simd
        for (int64_t j = 0; j < tiles.per_sample(); ++j) {
          const T r0 = even[j], r1 = odd[j], r2 = even[j + tw], r3 = odd[j + tw];
          d0[j] = r0 - r2;
          d1[j] = r1 + r2;
          d2[j] = r2 - r1;
          d3[j] = r1 - r3;
        }
      }
    }
    for (int64_t xi = 0; xi < kPositions; ++xi) {
      std::copy(channel_rows + xi * ld, channel_rows + (xi + 1) * ld, v + (xi * s.c + c) * ld);
    }
  }
}

// Writes the 2 n values e0 o0 e1 o1 ... (e and o interleaved) at p: as one pair of vectors when
// all 2 kLanes fit before `limit` (the lanes past 2 n land on values the caller writes later, which
// saves the scalar tail), else value by value.
template <typename T>
void store_pairs(T* p, const Vec<T>& e, const Vec<T>& o, int64_t n, const T* limit) {
  using Index = typename Lanes<T>::Index;
  if (p + 2 * kLanes <= limit) {
    store(p, Vec<T>(__builtin_shuffle(e, o, Index{0, 8, 1, 9, 2, 10, 3, 11})));
    store(p + kLanes, Vec<T>(__builtin_shuffle(e, o, Index{4, 12, 5, 13, 6, 14, 7, 15})));
    return;
  }
  for (int64_t i = 0; i < n; ++i) p[i] = i % 2 == 0 ? e[i / 2] : o[i / 2];
}

// One sample's y [O, OH, OW] = bias + A^T m A for each tile's m (position 4 l + k from
// M [16, O, ld], columns t0 ...), A^T = [1 1 1 0; 0 1 -1 -1], edge tiles clipped. A^T goes across
// the tile's rows first, for each column k: s0 = m0 + m1 + m2, s1 = m1 - m2 - m3 (ml the value
// at 4 l + k); then A along each output row from its columns q0 ... q3 (the s0, or the s1):
// out[2 tx] = b + (q0 + q1 + q2), out[2 tx + 1] = b + (q1 - q2 - q3). Writes may run past the
// sample's y onto values written later, never past `limit` (the end of the chunk's outputs).
// scratch: input_scratch.
template <typename T>
void output_tiles(const T* m, const ConvShape& s, const Tiling& tiles, int64_t ld, int64_t t0,
                  const T* bias, T* scratch, T* y, const T* limit) {
  const int64_t blocks = lane_blocks(tiles);
  const int64_t next = 4 * s.o * ld;  // from position 4 l + k to 4 (l + 1) + k
  for (int64_t o = 0; o < s.o; ++o) {
    const T b = bias ? bias[o] : T(0);
    T* plane = y + o * s.oh * s.ow;
    for (int64_t ty = 0; ty < tiles.th; ++ty) {
      T* top = plane + 2 * ty * s.ow;
      for (int64_t block = 0; block < blocks; ++block) {
        const T* at = m + o * ld + t0 + ty * tiles.tw + block * kLanes;
        Vec<T> s0[4], s1[4];
        for (int k = 0; k < 4; ++k) {
          const T* mk = at + k * s.o * ld;
          const Vec<T> m0 = load(mk), m1 = load(mk + next), m2 = load(mk + 2 * next),
                       m3 = load(mk + 3 * next);
          s0[k] = m0 + m1 + m2;
          s1[k] = m1 - m2 - m3;
        }
        const int64_t n = std::min(2 * kLanes, s.ow - 2 * kLanes * block);
        store_pairs(top + 2 * kLanes * block, b + (s0[0] + s0[1] + s0[2]),
                    b + (s0[1] - s0[2] - s0[3]), n, limit);
        store(scratch + 2 * block * kLanes, b + (s1[0] + s1[1] + s1[2]));  // the bottom row's
        store(scratch + (2 * block + 1) * kLanes, b + (s1[1] - s1[2] - s1[3]));
      }
      if (2 * ty + 1 >= s.oh) continue;
      for (int64_t block = 0; block < blocks; ++block) {  // after the whole top row
        const int64_t n = std::min(2 * kLanes, s.ow - 2 * kLanes * block);
        store_pairs(top + s.ow + 2 * kLanes * block, load(scratch + 2 * block * kLanes),
                    load(scratch + (2 * block + 1) * kLanes), n, limit);
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
  ThreadScratch<T> scratch(1, v_size + m_size + input_scratch(tiles, most), dtype);
  for_library_calls(ch.count, s.macs() >= kParallelMacs, [&](int64_t chunk) {
    T* v = scratch.mine();
    T* m = v + v_size;
    T* rows = m + m_size;
    const int64_t first = ch.first(chunk), end = ch.end(chunk, s.n);
    const int64_t ld = (end - first) * tiles.per_sample();
    input_tiles(x + first * s.image(), end - first, s, g, tiles, ld, rows, v);
    for (int64_t xi = 0; xi < kPositions; ++xi) {
      blas(CblasNoTrans, CblasNoTrans, int(s.o), int(ld), int(s.c), T(1), u + xi * s.o * s.c,
           int(s.c), v + xi * s.c * ld, int(ld), T(0), m + xi * s.o * ld, int(ld));
    }
    for (int64_t n = first; n < end; ++n) {
      output_tiles(m, s, tiles, ld, (n - first) * tiles.per_sample(), bias, rows,
                   y + n * s.output(), y + end * s.output());
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
