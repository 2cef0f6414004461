// SGD with momentum, PyTorch's semantics: buf = momentum * buf + (1 - dampening) * g (the first
// step sets buf = g), nesterov optional, L2 weight decay added to the gradient.
#pragma once

#include "optim/optimizer.h"

namespace accrue::optim {

struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(ParameterArena& arena, SgdOptions options);
  size_t state_bytes() const override { return momentum_.nbytes(); }

 protected:
  void update() override;
  void resize_state(int64_t elements) override;
  std::vector<nn::NamedTensor> element_state() override { return {{"momentum_buffer", momentum_}}; }

 private:
  SgdOptions options_;
  Tensor momentum_;  // [arena size, or this rank's shard]
};

}  // namespace accrue::optim
