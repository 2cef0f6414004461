// The softmax family over the last dimension of [N, C] logits: log_softmax, the fused softmax
// cross-entropy (sum reduction by default: the reduction gradient accumulation wants), argmax;
// and attention's causal softmax over [B, T, T] scores.
#include <cmath>
#include <memory>

#include "kernels/backend.h"
#include "ops/autograd.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace accrue {

namespace {

// dx = dy - softmax * rowsum(dy).
struct LogSoftmaxBackward : Node {
  Tensor y;  // [N, C] log-probabilities
  const char* name() const override { return "log_softmax"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    backend_for(dy.device()).log_softmax_backward(y, dy, dx);
    sink.add(0, dx);
  }
};

// y = causal softmax of scale * x. dx = scale * y * (dy - rowsum(y * dy)).
struct CausalSoftmaxBackward : Node {
  Tensor y;  // [B, T, T] attention weights
  double scale = 1;
  const char* name() const override { return "causal_softmax"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    backend_for(dy.device()).causal_softmax_backward(scale, y, dy, dx);
    sink.add(0, dx);
  }
};

// dlogits = dloss * (softmax - onehot(labels)).
struct CrossEntropyBackward : Node {
  Tensor probs;   // [N, C]
  Tensor labels;  // int32 [N]
  const char* name() const override { return "cross_entropy"; }
  void backward(const Tensor& dloss, GradSink& sink) override {
    Tensor dlogits = Tensor::empty(probs.shape(), probs.dtype(), probs.device());
    backend_for(probs.device()).cross_entropy_backward(probs, labels, dloss, dlogits);
    sink.add(0, dlogits);
  }
};

void check_logits(const char* op, const Tensor& logits) {
  check::floating(op, "logits", logits);
  if (logits.dim() != 2 || logits.size(1) == 0) {
    throw ShapeError(str_cat("[", op, "] logits must be [N, C] with C > 0, got shape ",
                             shape_str(logits.shape())));
  }
}

void check_labels(const Tensor& logits, const Tensor& labels) {
  check::defined("cross_entropy", "labels", labels);
  check::same_device("cross_entropy", logits, labels);
  if (labels.dtype() != DType::kInt32) {
    throw DTypeError(str_cat("[cross_entropy] labels must be int32, got ", labels.describe()));
  }
  if (labels.dim() != 1 || labels.size(0) != logits.size(0)) {
    throw ShapeError(str_cat("[cross_entropy] logits have shape ", shape_str(logits.shape()),
                             " but labels have shape ", shape_str(labels.shape())));
  }
  // Labels on the host are checked here; a CUDA kernel reports a bad label as a NaN loss.
  if (labels.device().is_cpu()) {
    const int32_t* l = labels.data<int32_t>();
    const int64_t classes = logits.size(1);
    for (int64_t n = 0; n < labels.numel(); ++n) {
      if ((l[n] < 0 || l[n] >= classes) && l[n] != kIgnoreLabel) {
        throw ValueError(str_cat("[cross_entropy] label ", l[n], " at row ", n,
                                 " is out of range for ", classes, " classes"));
      }
    }
  }
}

}  // namespace

Tensor log_softmax(const Tensor& logits) {
  check_logits("log_softmax", logits);
  Tensor y = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  backend_for(logits.device()).log_softmax(logits, y);
  if (should_record({&logits})) {
    auto node = std::make_unique<LogSoftmaxBackward>();
    node->y = node->save(y.view(y.shape()));
    record(std::move(node), {&logits}, y);
  }
  return y;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Reduction reduction) {
  check_logits("cross_entropy", logits);
  check_labels(logits, labels);
  Tensor loss = Tensor::empty({}, logits.dtype(), logits.device());
  Tensor probs = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  backend_for(logits.device()).cross_entropy(logits, labels, loss, probs);
  if (should_record({&logits})) {
    auto node = std::make_unique<CrossEntropyBackward>();
    node->probs = node->save(probs);
    node->labels = node->save(labels);
    record(std::move(node), {&logits}, loss);
  }
  if (reduction == Reduction::kMean) {
    return scale(loss, 1.0 / static_cast<double>(std::max<int64_t>(logits.size(0), 1)));
  }
  return loss;
}

Tensor causal_softmax(const Tensor& scores, double scale) {
  check::floating("causal_softmax", "scores", scores);
  if (scores.dim() != 3 || scores.size(1) > scores.size(2)) {
    throw ShapeError(str_cat("[causal_softmax] scores must be [B, T, L] with T <= L, got shape ",
                             shape_str(scores.shape())));
  }
  if (!std::isfinite(scale)) {
    throw ValueError(str_cat("[causal_softmax] the scale must be finite, got ", scale));
  }
  if (is_half(scores.dtype())) {  // mixed precision: the softmax and its backward in float32
    return cast(causal_softmax(cast(scores, DType::kFloat32), scale), scores.dtype());
  }
  Tensor y = Tensor::empty(scores.shape(), scores.dtype(), scores.device());
  backend_for(scores.device()).causal_softmax(scale, scores, y);
  if (should_record({&scores})) {
    auto node = std::make_unique<CausalSoftmaxBackward>();
    node->y = node->save(y.view(y.shape()));
    node->scale = scale;
    record(std::move(node), {&scores}, y);
  }
  return y;
}

Tensor argmax(const Tensor& x) {
  check_logits("argmax", x);
  Tensor index = Tensor::empty({x.size(0)}, DType::kInt32, x.device());
  backend_for(x.device()).argmax(x, index);
  return index;
}

int64_t count_equal(const Tensor& a, const Tensor& b) {
  return static_cast<int64_t>(equal_count(a, b).item());
}

Tensor equal_count(const Tensor& a, const Tensor& b) {
  check::defined("equal_count", "first input", a);
  check::defined("equal_count", "second input", b);
  check::same_device("equal_count", a, b);
  if (a.dtype() != DType::kInt32 || b.dtype() != DType::kInt32 || a.shape() != b.shape()) {
    throw ShapeError(str_cat("[equal_count] needs two int32 tensors of one shape, got ",
                             a.describe(), " and ", b.describe()));
  }
  Tensor out = Tensor::empty({}, DType::kInt32, a.device());
  backend_for(a.device()).count_equal(a, b, out);
  return out;
}

}  // namespace accrue
