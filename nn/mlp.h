// MLP: Linear layers with an activation between them (none after the last). The i-th Linear is
// registered as "layers.{i}", so its parameters are "layers.{i}.weight" [out, in] and
// "layers.{i}.bias", the names a PyTorch module with `self.layers = nn.ModuleList(...)` uses.
#pragma once

#include <memory>
#include <vector>

#include "nn/linear.h"

namespace accrue::nn {

enum class Activation { kRelu, kTanh, kGelu };

class MLP : public Module {
 public:
  // sizes: {in, hidden..., out}, at least two entries.
  explicit MLP(const std::vector<int64_t>& sizes, Activation activation = Activation::kRelu,
               DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& x) override;
  const std::vector<std::shared_ptr<Linear>>& layers() const { return layers_; }

 private:
  std::vector<std::shared_ptr<Linear>> layers_;
  Activation activation_;
};

}  // namespace accrue::nn
