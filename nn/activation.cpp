// Activation module forwards.
#include "nn/activation.h"

#include "ops/ops.h"

namespace accrue::nn {

Tensor ReLU::forward(const Tensor& x) {
  return relu(x);
}
Tensor Tanh::forward(const Tensor& x) {
  return accrue::tanh(x);
}
Tensor GELU::forward(const Tensor& x) {
  return gelu(x);
}

}  // namespace accrue::nn
