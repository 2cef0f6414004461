// Adam and AdamW with PyTorch's defaults and semantics (betas 0.9 / 0.999, eps 1e-8 added
// outside the square root, bias correction; Adam adds weight decay to the gradient, AdamW
// decays the parameter directly). One fused pass per step: kernels/functors.h AdamUpdate.
#pragma once

#include "optim/optimizer.h"

namespace accrue::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

class Adam : public Optimizer {
 public:
  Adam(ParameterArena& arena, AdamOptions options = {}, bool decoupled = false);
  const Tensor& exp_avg() const { return m_; }     // [arena size, or this rank's shard]
  const Tensor& exp_avg_sq() const { return v_; }  // [arena size, or this rank's shard]
  size_t state_bytes() const override { return m_.nbytes() + v_.nbytes(); }

 protected:
  void update() override;
  void resize_state(int64_t elements) override;
  std::vector<nn::NamedTensor> element_state() override {
    return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
  }

 private:
  AdamOptions options_;
  bool decoupled_;
  Tensor m_, v_;
};

// AdamW: PyTorch's default weight decay is 1e-2.
class AdamW : public Adam {
 public:
  static AdamOptions defaults() {
    AdamOptions o;
    o.weight_decay = 1e-2;
    return o;
  }
  explicit AdamW(ParameterArena& arena, AdamOptions options = defaults())
      : Adam(arena, options, true) {}
};

}  // namespace accrue::optim
