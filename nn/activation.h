// Activation modules: thin wrappers over the element-wise ops, so they can sit in a Sequential.
#pragma once

#include "nn/module.h"

namespace accrue::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

}  // namespace accrue::nn
