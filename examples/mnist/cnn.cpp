// The MNIST CNN (see cnn.h).
#include "cnn.h"

#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/norm.h"
#include "ops/ops.h"

namespace accrue::mnist {

MnistCNN::Norm MnistCNN::parse_norm(const std::string& name) {
  if (name == "none") return Norm::kNone;
  if (name == "batch") return Norm::kBatch;
  if (name == "group") return Norm::kGroup;
  if (name == "group1") return Norm::kGroup1;
  throw ValueError("[MnistCNN] norm '" + name + "': expected none, batch, group or group1");
}

std::shared_ptr<nn::Module> MnistCNN::make_norm(Norm norm, int64_t channels, DType dtype) {
  switch (norm) {
    case Norm::kBatch:
      return std::make_shared<nn::BatchNorm2d>(channels, 1e-5, 0.1, true, dtype);
    case Norm::kGroup:
      return std::make_shared<nn::GroupNorm>(8, channels, 1e-5, true, dtype);
    case Norm::kGroup1:
      return std::make_shared<nn::GroupNorm>(1, channels, 1e-5, true, dtype);
    case Norm::kNone:
      break;
  }
  return nullptr;
}

MnistCNN::MnistCNN(Norm norm, DType dtype) {
  // Registered in forward order, so the arena and the checkpoint list them as PyTorch does.
  conv1_ = register_module("conv1", std::make_shared<nn::Conv2d>(1, 32, 3, 1, 1, 1, true, dtype));
  if (auto n = make_norm(norm, 32, dtype)) norm1_ = register_module("norm1", n);
  conv2_ = register_module("conv2", std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1, 1, true, dtype));
  if (auto n = make_norm(norm, 64, dtype)) norm2_ = register_module("norm2", n);
  fc1_ = register_module("fc1", std::make_shared<nn::Linear>(64 * 7 * 7, 128, true, dtype));
  fc2_ = register_module("fc2", std::make_shared<nn::Linear>(128, 10, true, dtype));
}

// max_pool2d(relu(norm(h))) by the fused ops, which give the separate ops' bits without their
// full-size passes: group norm, ReLU and pooling as one (ops/norm.cpp), or the ReLU inside the
// pooling after a batch norm or none.
Tensor MnistCNN::norm_relu_pool(nn::Module* norm, const Tensor& h, const Pool2dGeometry& pool) {
  if (auto* group = dynamic_cast<nn::GroupNorm*>(norm))
    return group->forward_relu_max_pool(h, pool);
  return max_pool2d_relu(norm != nullptr ? (*norm)(h) : h, pool);
}

Tensor MnistCNN::forward(const Tensor& x) {
  const bool rows = x.dim() == 2 && x.size(1) == 28 * 28;
  const bool images = x.dim() == 4 && x.size(1) == 1 && x.size(2) == 28 && x.size(3) == 28;
  if (!rows && !images) {
    throw ShapeError(
        str_cat("[MnistCNN] expects [N, 784] or [N, 1, 28, 28], got shape ", shape_str(x.shape())));
  }
  const Pool2dGeometry pool{2, 2, 2, 2, 0, 0};
  Tensor h = rows ? reshape(x, {x.size(0), 1, 28, 28}) : x;
  h = norm_relu_pool(norm1_.get(), (*conv1_)(h), pool);
  h = norm_relu_pool(norm2_.get(), (*conv2_)(h), pool);
  h = fc1_->forward_relu(flatten(h));
  return (*fc2_)(h);
}

}  // namespace accrue::mnist
