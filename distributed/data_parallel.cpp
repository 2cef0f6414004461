// Replicated data parallelism (see data_parallel.h).
#include "distributed/data_parallel.h"

namespace accrue::distributed {

GradientAllReduce::~GradientAllReduce() {
  abandon();
}

void GradientAllReduce::ready(int64_t begin, int64_t end) {
  Tensor range = arena_.grads().narrow(begin, end - begin);
  comm_.start_all_reduce_sum(range);
  started_ = true;
}

void GradientAllReduce::finish() {
  if (started_) {
    started_ = false;
    comm_.wait_all();
  } else {
    // The one exchange of the window: every rank's share of the window gradient, summed.
    comm_.all_reduce_sum(arena_.grads());
  }
}

bool GradientAllReduce::abandon() {
  if (!started_) return true;
  started_ = false;
  try {
    comm_.wait_all();
  } catch (...) {
    return false;
  }
  return true;
}

}  // namespace accrue::distributed
