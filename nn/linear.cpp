// Linear layer construction and forward.
#include "nn/linear.h"

#include "kernels/profile.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace accrue::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype)
    : in_(in_features), out_(out_features) {
  if (in_features <= 0 || out_features <= 0) {
    throw ShapeError(str_cat("[Linear] features must be positive, got in_features = ", in_features,
                             ", out_features = ", out_features));
  }
  const double bound = linear_init_bound(in_features);
  weight_ = Tensor::empty({out_features, in_features}, dtype);
  uniform_(weight_, bound);
  register_parameter("weight", weight_);
  if (bias) {
    bias_ = Tensor::empty({out_features}, dtype);
    uniform_(bias_, bound);
    register_parameter("bias", bias_);
  }
}

Tensor Linear::forward(const Tensor& x) {
  return linear(x, weight_, bias_);
}

Tensor Linear::forward_relu(const Tensor& x) {
  const ProfileScope scope(profile_scope());
  return linear_relu(x, weight_, bias_);
}

}  // namespace accrue::nn
