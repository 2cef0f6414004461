// MLP construction and forward.
#include "nn/mlp.h"

#include <string>

#include "core/ops.h"

namespace accrue::nn {

MLP::MLP(const std::vector<int64_t>& sizes, Activation activation, DType dtype)
    : activation_(activation) {
  if (sizes.size() < 2) {
    throw ValueError(
        str_cat("[MLP] needs at least input and output sizes, got ", sizes.size(), " size(s)"));
  }
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers_.push_back(
        register_module("layers." + std::to_string(i),
                        std::make_shared<Linear>(sizes[i], sizes[i + 1], true, dtype)));
  }
}

Tensor MLP::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = layers_[i]->forward(h);
    if (i + 1 == layers_.size()) break;
    switch (activation_) {
      case Activation::kRelu:
        h = relu(h);
        break;
      case Activation::kTanh:
        h = accrue::tanh(h);
        break;
      case Activation::kGelu:
        h = gelu(h);
        break;
    }
  }
  return h;
}

}  // namespace accrue::nn
