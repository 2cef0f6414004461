// SGD: state allocation and the fused pass.
#include "optim/sgd.h"

#include "kernels/backend.h"

namespace accrue::optim {

SGD::SGD(ParameterArena& arena, SgdOptions options)
    : Optimizer(arena, options.lr),
      options_(options),
      momentum_(state_zeros({arena.size()}, arena.dtype())) {
  require_finite_at_least("SGD", "momentum", options.momentum, 0);
  require_finite_at_least("SGD", "dampening", options.dampening, 0);
  require_finite_at_least("SGD", "weight_decay", options.weight_decay, 0);
  if (options.nesterov && (options.momentum <= 0 || options.dampening != 0)) {
    throw ValueError("[SGD] nesterov needs momentum > 0 and dampening = 0");
  }
}

void SGD::update() {
  const SgdArgs hp{lr_, options_.momentum, options_.dampening, options_.weight_decay,
                   options_.nesterov};
  backend_for(state_device())
      .sgd_step(hp, boundary_, applied_steps_, params_, grads_, momentum_, working_);
}

void SGD::resize_state(int64_t elements) {
  momentum_ = state_zeros({elements}, arena_.dtype());
}

}  // namespace accrue::optim
