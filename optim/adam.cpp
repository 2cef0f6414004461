// Adam / AdamW: state allocation and the fused pass.
#include "optim/adam.h"

#include "kernels/backend.h"

namespace accrue::optim {

Adam::Adam(ParameterArena& arena, AdamOptions options, bool decoupled)
    : Optimizer(arena, options.lr),
      options_(options),
      decoupled_(decoupled),
      m_(state_zeros({arena.size()}, arena.dtype())),
      v_(state_zeros({arena.size()}, arena.dtype())) {
  if (!(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1)) {
    throw ValueError(
        str_cat("[Adam] betas must be in [0, 1), got ", options.beta1, ", ", options.beta2));
  }
  require_finite_at_least("Adam", "eps", options.eps, 0);
  require_finite_at_least("Adam", "weight_decay", options.weight_decay, 0);
}

void Adam::update() {
  const AdamArgs hp{lr_,          options_.beta1,        options_.beta2,
                    options_.eps, options_.weight_decay, decoupled_};
  backend_for(state_device())
      .adam_step(hp, boundary_, applied_steps_, params_, grads_, m_, v_, working_);
}

void Adam::resize_state(int64_t elements) {
  m_ = state_zeros({elements}, arena_.dtype());
  v_ = state_zeros({elements}, arena_.dtype());
}

}  // namespace accrue::optim
