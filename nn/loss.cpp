// CrossEntropyLoss forward.
#include "nn/loss.h"

namespace accrue::nn {

Tensor CrossEntropyLoss::operator()(const Tensor& logits, const Tensor& labels) const {
  return cross_entropy(logits, labels, reduction_);
}

}  // namespace accrue::nn
