// CPU convolution in 16 bits (bfloat16 and float16 activations and working weights, mixed
// precision), NCHW: im2col + GEMM as conv.cpp's, each product one call of half_product (the 16-bit
// GEMM's per-block call: bfloat16 on the matrix units through oneDNN where the CPU has them, else
// float32 copies of the operands through sgemm). Every sum runs in float32 and is rounded once:
// a sample's output [O, OH OW] is summed in a float32 scratch onto the bias and rounded into y;
// the data gradient's patches are folded back in float32 and rounded into dx; the filter
// gradient's chunk sums are float32, added in chunk order and written either into the float32
// gradient arena (the parameters' buffers, beta = 1) or rounded into a 16-bit tensor.
//
// The work is cut as conv.cpp's (samples, and chunks of samples fixed by the shape), so no bit
// depends on the thread count. Where conv.cpp's direct kernels apply (conv1's one input channel)
// a 16-bit convolution takes them instead, in float32 lanes: a K = 9 product is too narrow for
// the matrix units. Winograd has no 16-bit version.
#include <algorithm>

#include "core/tensor.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/conv_lowering.h"
#include "kernels/cpu/gemm_cut.h"
#include "kernels/cpu/half_product.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"

namespace accrue::cpu::half_conv {

using namespace lowering;

template <typename H>
void forward(const H* x, const H* w, const H* bias, const ConvShape& s, const Conv2dGeometry& g,
             H* y) {
  // per sample: y[n] [O, OH OW] = bias + w [O, C KH KW] @ cols [C KH KW, OH OW], summed in float32
  check_blas_sizes(s, "conv2d");
  const int64_t k = s.patch(), p = s.pixels();
  ThreadScratch<H> cols(1, k * p + padded_plane(s, g).size(), dtype_of<H>());
  ThreadScratch<float> sums(s.o, p, DType::kFloat32);
  for_library_calls(s.n, s.macs() >= kParallelMacs, [&](int64_t n) {
    H* unfolded = cols.mine();
    float* out = sums.mine();
    im2col(x + n * s.image(), s, g, unfolded + k * p, unfolded, p);
    for (int64_t o = 0; o < s.o; ++o) {
      std::fill(out + o * p, out + (o + 1) * p, bias ? load(bias[o]) : 0.0f);
    }
    half_product(false, false, int(s.o), int(p), int(k), 1.0f, w, std::max<int>(k, 1), unfolded,
                 int(p), 1.0f, out, int(p));
    row_from_float(out, y + n * s.output(), s.output());
  });
}

template <typename H>
void backward_data(const H* dy, const H* w, const ConvShape& s, const Conv2dGeometry& g, H* dx) {
  // per sample: dcols [C KH KW, OH OW] = w^T @ dy[n] [O, OH OW], folded back in float32, rounded
  check_blas_sizes(s, "conv2d_backward_data");
  const int64_t k = s.patch(), p = s.pixels();
  // w^T [C KH KW, O], once: each sample's product then reads both operands in their stored order
  Tensor transposed = Tensor::empty({k, s.o}, dtype_of<H>(), Device::cpu());
  H* wt = transposed.data<H>();
  for_range(k, k * s.o, [=](int64_t row) {
    for (int64_t o = 0; o < s.o; ++o) wt[row * s.o + o] = w[o * k + row];
  });
  ThreadScratch<float> scratch(1, k * p + s.image() + padded_plane(s, g).size(), DType::kFloat32);
  for_library_calls(s.n, s.macs() >= kParallelMacs, [&](int64_t n) {
    float* dcols = scratch.mine();
    float* image = dcols + k * p;
    half_product(false, false, int(k), int(p), int(s.o), 1.0f, wt, std::max<int>(s.o, 1),
                 dy + n * s.output(), int(p), 0.0f, dcols, int(p));
    col2im(dcols, s, g, image + s.image(), image);
    row_from_float(image, dx + n * s.image(), s.image());
  });
}

template <typename H, typename O>
void backward_filter(const H* dy, const H* x, const ConvShape& s, const Conv2dGeometry& g,
                     double beta, O* dw, O* dbias) {
  // dw [O, C KH KW] = beta dw + sum over chunks of (sum over the chunk's samples of
  // dy[n] [O, OH OW] @ cols(x[n])^T), each chunk's partial sum in float32; dbias the sum of dy
  // over samples and pixels in float64, as the float32 path's
  check_blas_sizes(s, "conv2d_backward_filter");
  if (dbias) bias_gradient(dy, s, beta, dbias);
  if (s.o * s.patch() == 0) return;
  const FilterChunks fc = filter_chunks(s, sizeof(H));
  const int64_t weights = s.o * s.patch();
  ThreadScratch<H> scratch(1, fc.scratch(s, g), dtype_of<H>());
  Tensor partials = Tensor::empty({fc.chunks, weights}, DType::kFloat32, Device::cpu());
  float* partial = partials.data<float>();
  for_library_calls(fc.chunks, s.macs() >= kParallelMacs, [&](int64_t chunk) {
    const int64_t first = chunk * fc.per_chunk, end = std::min(s.n, first + fc.per_chunk);
    for (int64_t group = first; group < end; group += fc.lowered) {
      const int64_t m = std::min(fc.lowered, end - group), p = m * s.pixels();
      H* cols = scratch.mine();            // [K, m P]
      H* gathered = cols + s.patch() * p;  // [O, m P]
      lower_samples(x, dy, s, g, group, m, cols, gathered);
      // partial [O, K] (+)= gathered [O, m P] @ cols [K, m P]^T
      half_product(false, true, int(s.o), int(s.patch()), int(p), 1.0f, gathered,
                   std::max<int>(p, 1), cols, std::max<int>(p, 1), group == first ? 0.0f : 1.0f,
                   partial + chunk * weights, int(s.patch()));
    }
  });
  for_range(weights, fc.chunks * weights, [=](int64_t i) {
    float total = 0;
    for (int64_t chunk = 0; chunk < fc.chunks; ++chunk) total += partial[chunk * weights + i];
    dw[i] = static_cast<O>(beta == 0 ? total : float(beta) * load(dw[i]) + total);
  });
}

template void forward(const bf16*, const bf16*, const bf16*, const ConvShape&,
                      const Conv2dGeometry&, bf16*);
template void forward(const f16*, const f16*, const f16*, const ConvShape&, const Conv2dGeometry&,
                      f16*);
template void backward_data(const bf16*, const bf16*, const ConvShape&, const Conv2dGeometry&,
                            bf16*);
template void backward_data(const f16*, const f16*, const ConvShape&, const Conv2dGeometry&, f16*);
template void backward_filter(const bf16*, const bf16*, const ConvShape&, const Conv2dGeometry&,
                              double, bf16*, bf16*);
template void backward_filter(const bf16*, const bf16*, const ConvShape&, const Conv2dGeometry&,
                              double, float*, float*);
template void backward_filter(const f16*, const f16*, const ConvShape&, const Conv2dGeometry&,
                              double, f16*, f16*);
template void backward_filter(const f16*, const f16*, const ConvShape&, const Conv2dGeometry&,
                              double, float*, float*);

}  // namespace accrue::cpu::half_conv
