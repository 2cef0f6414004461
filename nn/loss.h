// Loss modules. CrossEntropyLoss is the fused softmax cross-entropy over int32 class labels;
// its default reduction is Sum, the one that makes gradient accumulation exact: the training
// driver seeds backward with 1 / (samples in the window). Mean is there for PyTorch parity.
#pragma once

#include "ops/ops.h"

namespace accrue::nn {

// What a loss hands to the training loop: the sum of its per-item losses and the number of items
// it summed (samples for classification, target tokens for a sequence model). The window's
// normaliser is the item count of the whole window; the counts check it. The count is a tensor
// computed with the loss, a number the host knows without the device (a classifier's rows: no
// kernel counts them), or the sum of both.
// A micro-step replayed from a CUDA graph adds the counts its capture added: a host count must
// follow from the micro-batch's shapes (the graph's key), as a classifier's rows do; a count that
// depends on the values (unmasked tokens) belongs in `count`.
struct LossSum {
  Tensor sum;    // 0-d, requires grad
  Tensor count;  // 0-d, any dtype (on the device: a count of unmasked tokens needs no host read)
  double host_count = 0;  // items known on the host, added to `count` (or alone, count undefined)
};

// Throws ValueError, naming `op`, unless the count is one element, a host count > 0, or both.
void check_count(const LossSum& loss, const char* op);

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(Reduction reduction = Reduction::kSum) : reduction_(reduction) {}
  // logits [N, C], labels int32 [N] -> 0-d loss
  Tensor operator()(const Tensor& logits, const Tensor& labels) const;
  Reduction reduction() const { return reduction_; }

 private:
  Reduction reduction_;
};

}  // namespace accrue::nn
