// The MNIST CNN of `accrue-mnist --model cnn`, with the names a PyTorch module of the same
// layers uses, so weights move both ways:
//   conv1 Conv2d(1, 32, 3, padding 1) -> norm1 -> ReLU -> MaxPool2d(2)
//   conv2 Conv2d(32, 64, 3, padding 1) -> norm2 -> ReLU -> MaxPool2d(2)
//   flatten -> fc1 Linear(3136, 128) -> ReLU -> fc2 Linear(128, 10)
// The norms are BatchNorm2d(C) (Norm::kBatch), GroupNorm(8, C) (kGroup), GroupNorm(1, C)
// (kGroup1: LayerNorm's statistics, per sample over C x H x W, with GroupNorm's per-channel
// affine rather than LayerNorm's per-element one) or absent (kNone). Input:
// [N, 784] rows of 28 x 28 pixels, or [N, 1, 28, 28]. Read next: mnist.cpp.
#pragma once

#include <memory>
#include <string>

#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/norm.h"

namespace accrue::mnist {

class MnistCNN : public nn::Module {
 public:
  enum class Norm { kNone, kBatch, kGroup, kGroup1 };
  // "none", "batch", "group", "group1"; throws ValueError otherwise.
  static Norm parse_norm(const std::string& name);

  explicit MnistCNN(Norm norm = Norm::kNone, DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& x) override;

 private:
  static Tensor norm_relu_pool(nn::Module* norm, const Tensor& h, const Pool2dGeometry& pool);
  std::shared_ptr<nn::Module> make_norm(Norm norm, int64_t channels, DType dtype);
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::Module> norm1_, norm2_;  // null for Norm::kNone
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

}  // namespace accrue::mnist
