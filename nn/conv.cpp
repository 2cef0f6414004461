// Convolution and pooling modules (see conv.h).
#include "nn/conv.h"

#include "nn/init.h"
#include "ops/ops.h"

namespace accrue::nn {

namespace {

Pool2dGeometry pool_geometry(const char* name, int64_t kernel, int64_t stride, int64_t padding) {
  if (kernel < 1 || stride < 0 || padding < 0) {
    throw ValueError(
        str_cat("[", name, "] kernel_size ", kernel, ", stride ", stride, ", padding ", padding,
                ": need kernel_size >= 1, stride >= 0 (0: ", "the kernel size), padding >= 0"));
  }
  const int64_t s = stride == 0 ? kernel : stride;
  return {kernel, kernel, s, s, padding, padding};
}

}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride,
               int64_t padding, int64_t dilation, bool bias, DType dtype)
    : geometry_{stride, stride, padding, padding, dilation, dilation} {
  if (in_channels <= 0 || out_channels <= 0 || kernel_size <= 0 || stride <= 0 || padding < 0 ||
      dilation <= 0) {
    throw ValueError(str_cat("[Conv2d] in_channels ", in_channels, ", out_channels ", out_channels,
                             ", kernel_size ", kernel_size, ", stride ", stride, ", padding ",
                             padding, ", dilation ", dilation, ": sizes, stride and dilation ",
                             "must be positive, padding >= 0"));
  }
  const double bound = linear_init_bound(in_channels * kernel_size * kernel_size);
  weight_ = Tensor::empty({out_channels, in_channels, kernel_size, kernel_size}, dtype);
  uniform_(weight_, bound);
  register_parameter("weight", weight_);
  if (bias) {
    bias_ = Tensor::empty({out_channels}, dtype);
    uniform_(bias_, bound);
    register_parameter("bias", bias_);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, weight_, bias_, geometry_);
}

MaxPool2d::MaxPool2d(int64_t kernel_size, int64_t stride, int64_t padding)
    : geometry_(pool_geometry("MaxPool2d", kernel_size, stride, padding)) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, geometry_);
}

AvgPool2d::AvgPool2d(int64_t kernel_size, int64_t stride, int64_t padding)
    : geometry_(pool_geometry("AvgPool2d", kernel_size, stride, padding)) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, geometry_);
}

Tensor Flatten::forward(const Tensor& x) {
  return flatten(x);
}

}  // namespace accrue::nn
