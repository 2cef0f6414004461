// Convolution and pooling modules with PyTorch's names, layouts and defaults: Conv2d (weight
// [out, in, kh, kw], bias [out], both U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in kh kw),
// MaxPool2d and AvgPool2d (stride defaults to the kernel), Flatten ([N, ...] -> [N, rest]).
// Read next: nn/norm.h.
#pragma once

#include "core/geometry.h"
#include "nn/module.h"

namespace accrue::nn {

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, int64_t dilation = 1, bool bias = true,
         DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& x) override;
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }
  const Conv2dGeometry& geometry() const { return geometry_; }

 private:
  Conv2dGeometry geometry_;
  Tensor weight_;  // [out, in, k, k]
  Tensor bias_;    // [out] or undefined
};

class MaxPool2d : public Module {
 public:
  // stride 0: the kernel size (PyTorch's default).
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;

 private:
  Pool2dGeometry geometry_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;

 private:
  Pool2dGeometry geometry_;
};

class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

}  // namespace accrue::nn
