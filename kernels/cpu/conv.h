// The CPU convolution's three algorithms and the rule that picks one. im2col + GEMM (conv.cpp)
// takes every geometry and pass; Winograd F(2x2, 3x3) (conv_winograd.cpp) takes the forward and
// data-gradient passes of 3x3 filters at stride 1, dilation 1 and padding up to 2, and does 16
// multiplications per 2x2 output tile and channel pair where the direct convolution does 36. The
// direct kernels (conv.cpp) take patches of at most 9 values (a one-channel 3x3 convolution): the
// filter gradient as dot products of dy's rows read in place (measured at conv1's shape, bias
// included: 330 -> 111 us against im2col's GEMM), and the forward at stride 1 along rows as
// multiply-add chains over taps read from the padded input (1.5x im2col's speed); the forward is
// the default only where OpenBLAS sums such a product as the same chain
// (blas_chains_short_products), so it gives im2col's bytes.
//
// The filter gradient is otherwise im2col's: Winograd's G^T dU G adds up terms several times larger
// than the result, and its float32 error measured 1.2-1.8x the backend table's bound (although
// it ran conv2's filter gradient at 1.60 ms against im2col's 1.95).
//
// The choice is a fixed function of the shape (never of the thread count or of timings taken at
// run time), so seeds, resume and thread counts stay bitwise. ForcedConvAlgorithm is the test
// hook that runs a chosen algorithm wherever it applies.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/geometry.h"

namespace accrue::cpu {

// The sizes of one convolution: x [N, C, H, W], w [O, C, KH, KW], y [N, O, OH, OW].
struct ConvShape {
  int64_t n, c, h, w, o, kh, kw, oh, ow;
  int64_t patch() const { return c * kh * kw; }  // rows of the unfolded patches
  int64_t pixels() const { return oh * ow; }     // columns of the unfolded patches
  int64_t image() const { return c * h * w; }    // one sample of x
  int64_t output() const { return o * pixels(); }
  int64_t macs() const { return n * output() * patch(); }
};

enum class ConvAlgorithm { kIm2col, kWinograd, kDirect };
enum class ConvPass { kForward, kBackwardData, kBackwardFilter };

const char* conv_algorithm_name(ConvAlgorithm algorithm);

// Whether the direct kernels (conv.cpp: patches of at most 9 values, as a one-channel 3x3
// convolution's) compute this pass of this convolution at all: the filter gradient, and the
// forward at stride 1 along rows with output rows of at least 16 values.
bool direct_applies(const ConvShape& s, const Conv2dGeometry& g, ConvPass pass);

// Whether Winograd F(2x2, 3x3) computes this pass of this convolution at all.
bool winograd_applies(const ConvShape& s, const Conv2dGeometry& g, ConvPass pass);

// The algorithm the CPU backend runs for this pass (the forced one where it applies).
ConvAlgorithm conv_algorithm(const ConvShape& s, const Conv2dGeometry& g, ConvPass pass);

// While alive, the calling thread's convolutions run `algorithm` wherever it applies (tests).
class ForcedConvAlgorithm {
 public:
  explicit ForcedConvAlgorithm(ConvAlgorithm algorithm);
  ~ForcedConvAlgorithm();
  ForcedConvAlgorithm(const ForcedConvAlgorithm&) = delete;
  ForcedConvAlgorithm& operator=(const ForcedConvAlgorithm&) = delete;

 private:
  int previous_;
};

// Winograd F(2x2, 3x3), its two passes; each requires winograd_applies. Deterministic and
// independent of the thread count: samples in chunks fixed by the shape.
namespace winograd {
template <typename T>
void forward(const T* x, const T* w, const T* bias, const ConvShape& s, const Conv2dGeometry& g,
             DType dtype, T* y);
template <typename T>
void backward_data(const T* dy, const T* w, const ConvShape& s, const Conv2dGeometry& g,
                   DType dtype, T* dx);
}  // namespace winograd

// The 16-bit convolution (conv_half.cpp), H being bf16 or f16: im2col with every sum in float32,
// rounded once. The filter gradient writes O = H, or float32 (the gradient arena). Deterministic
// and independent of the thread count, as im2col's.
namespace half_conv {
template <typename H>
void forward(const H* x, const H* w, const H* bias, const ConvShape& s, const Conv2dGeometry& g,
             H* y);
template <typename H>
void backward_data(const H* dy, const H* w, const ConvShape& s, const Conv2dGeometry& g, H* dx);
template <typename H, typename O>
void backward_filter(const H* dy, const H* x, const ConvShape& s, const Conv2dGeometry& g,
                     double beta, O* dw, O* dbias);
}  // namespace half_conv

}  // namespace accrue::cpu
