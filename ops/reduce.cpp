// Full reductions: sum and mean of every element into a 0-d tensor. Backward broadcasts the
// output gradient (times 1/numel for mean) back to the input's shape on the device.
#include <memory>

#include "kernels/backend.h"
#include "ops/autograd.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace accrue {

namespace {

// dx [shape] = alpha * dy[0] everywhere.
struct SumBackward : Node {
  Shape shape;
  double alpha;  // 1 for sum, 1 / numel for mean
  const char* name() const override { return alpha == 1.0 ? "sum" : "mean"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor dx = Tensor::empty(shape, dy.dtype(), dy.device());
    backend_for(dy.device()).expand_scalar(dy, alpha, dx);
    sink.add(0, dx);
  }
};

Tensor reduce(const char* op, const Tensor& x, bool average) {
  check::floating(op, "input", x);
  const double alpha = average ? 1.0 / static_cast<double>(x.numel()) : 1.0;
  if (average && x.numel() == 0) {
    throw ShapeError(str_cat("[mean] input ", x.describe(), " has no elements"));
  }
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  Backend& be = backend_for(x.device());
  be.sum_all(x, out);
  if (average) be.scale(alpha, out, out);
  if (should_record({&x})) {
    auto node = std::make_unique<SumBackward>();
    node->shape = x.shape();
    node->alpha = alpha;
    record(std::move(node), {&x}, out);
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) {
  return reduce("sum", x, false);
}
Tensor mean(const Tensor& x) {
  return reduce("mean", x, true);
}

}  // namespace accrue
