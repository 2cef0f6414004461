// Linear: y = x W^T + b with PyTorch's layout (weight [out_features, in_features], bias
// [out_features]) and default initialisation. Backward accumulates dW and db straight into the
// gradient arena (ops/linear.cpp).
#pragma once

#include "nn/module.h"

namespace accrue::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)) as one op (ops/ops.h linear_relu: the same results, fewer passes), under
  // this layer's profile scope.
  Tensor forward_relu(const Tensor& x);
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  Tensor weight() const { return weight_; }
  Tensor bias() const { return bias_; }

 private:
  int64_t in_, out_;
  Tensor weight_;  // [out, in]
  Tensor bias_;    // [out] or undefined
};

}  // namespace accrue::nn
