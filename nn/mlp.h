// MLP: Linear layers with an activation module between them (none after the last). The i-th
// Linear is registered as "layers.{i}", so its parameters are "layers.{i}.weight" [out, in] and
// "layers.{i}.bias", the names a PyTorch module with `self.layers = nn.ModuleList(...)` uses. The
// activation is any module (nn/activation.h), given as a factory: one instance per hidden layer.
// A Linear followed by a ReLU runs as the fused linear_relu op (same results, fewer passes).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "nn/activation.h"
#include "nn/linear.h"

namespace accrue::nn {

// Makes one activation module; activation<ReLU>() is the default.
using ActivationFactory = std::function<std::shared_ptr<Module>()>;
template <typename M>
ActivationFactory activation() {
  return [] { return std::make_shared<M>(); };
}

class MLP : public Module {
 public:
  // sizes: {in, hidden..., out}, at least two entries.
  explicit MLP(const std::vector<int64_t>& sizes,
               const ActivationFactory& make_activation = activation<ReLU>(),
               DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& x) override;
  // Linear i and the activation after it (none after the last): forward() is these in turn,
  // and a pipeline's stages run them apart.
  Tensor forward_layer(size_t i, const Tensor& h);
  const std::vector<std::shared_ptr<Linear>>& layers() const { return layers_; }

 private:
  std::vector<std::shared_ptr<Linear>> layers_;
  std::vector<std::shared_ptr<Module>> activations_;  // one fewer than layers_; no parameters
};

}  // namespace accrue::nn
