// MLP construction and forward.
#include "nn/mlp.h"

#include <string>

#include "ops/ops.h"

namespace accrue::nn {

MLP::MLP(const std::vector<int64_t>& sizes, const ActivationFactory& make_activation, DType dtype) {
  if (sizes.size() < 2) {
    throw ValueError(
        str_cat("[MLP] needs at least input and output sizes, got ", sizes.size(), " size(s)"));
  }
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers_.push_back(
        register_module("layers." + std::to_string(i),
                        std::make_shared<Linear>(sizes[i], sizes[i + 1], true, dtype)));
    if (i + 2 < sizes.size()) activations_.push_back(make_activation());
  }
}

Tensor MLP::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) h = forward_layer(i, h);
  return h;
}

Tensor MLP::forward_layer(size_t i, const Tensor& h) {
  const bool activated = i < activations_.size();
  if (activated && dynamic_cast<const ReLU*>(activations_[i].get()) != nullptr) {
    return layers_.at(i)->forward_relu(h);
  }
  const Tensor out = (*layers_.at(i))(h);
  return activated ? (*activations_[i])(out) : out;
}

}  // namespace accrue::nn
