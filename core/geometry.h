// The plain parameters of the convolution, pooling and dropout ops, shared by the public ops
// (ops/ops.h) and the backends (kernels/backend.h). Read next: ops/conv.cpp.
#pragma once

#include <cstdint>

namespace accrue {

// The geometry of a 2-D convolution (NCHW, groups = 1) and of a pooling region. Output sizes:
// out = (in + 2 pad - dilation (kernel - 1) - 1) / stride + 1 (conv2d_out_size).
struct Conv2dGeometry {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
};
struct Pool2dGeometry {
  int64_t kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0;
};
// 0 when the (dilated) kernel does not fit the padded input at all (C++ division truncates toward
// zero: the formula alone would give 1 for a kernel up to a stride longer than the input).
inline int64_t conv2d_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                               int64_t dilation) {
  const int64_t last_start = in + 2 * pad - dilation * (kernel - 1) - 1;
  return last_start < 0 ? 0 : last_start / stride + 1;
}
// The counter-based key of a dropout mask: an element's fate is a hash of (seed, step, the
// sample's index in the dataset, the element's index within the sample), so a sample gets the
// same mask in whichever micro-batch it lands.
struct DropoutKey {
  double p = 0.5;  // probability of dropping
  uint64_t seed = 0;
  int64_t step = 0;
};

}  // namespace accrue
