// reshape: a view with a new shape, recorded so gradients flow back in the input's shape.
#include <memory>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/ops/check.h"

namespace accrue {

namespace {

struct ReshapeBackward : Node {
  Shape input_shape;
  const char* name() const override { return "reshape"; }
  void backward(const Tensor& dy, GradSink& sink) override { sink.add(0, dy.view(input_shape)); }
};

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  check::defined("reshape", "input", x);
  if (shape_numel(shape) != x.numel()) {
    throw ShapeError(str_cat("[reshape] cannot reshape ", shape_str(x.shape()), " (", x.numel(),
                             " elements) to ", shape_str(shape)));
  }
  Tensor out = x.view(shape);
  if (should_record({&x})) {
    auto node = std::make_unique<ReshapeBackward>();
    node->input_shape = x.shape();
    record(std::move(node), {&x}, out);
  }
  return out;
}

}  // namespace accrue
