// CrossEntropyLoss forward, and the check of a LossSum's count.
#include "nn/loss.h"

#include <cmath>

namespace accrue::nn {

void check_count(const LossSum& loss, const char* op) {
  const Tensor& count = loss.count;
  if (!(loss.host_count >= 0) || !std::isfinite(loss.host_count) ||
      (count.defined() ? count.numel() != 1 : loss.host_count == 0)) {
    throw ValueError(str_cat("[", op, "] a LossSum's count must be one element or a host ",
                             "count > 0 (or both), got ", count.describe(), " and host count ",
                             loss.host_count));
  }
}

Tensor CrossEntropyLoss::operator()(const Tensor& logits, const Tensor& labels) const {
  return cross_entropy(logits, labels, reduction_);
}

}  // namespace accrue::nn
