// reshape: a view with a new shape, recorded so gradients flow back in the input's shape.
// gather_rows: row selection for building micro-batches from a shuffled dataset.
// cast: a recorded dtype conversion (mixed precision: 16-bit logits to float32 for the loss).
#include <memory>

#include "kernels/backend.h"
#include "ops/autograd.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace accrue {

namespace {

struct ReshapeBackward : Node {
  Shape input_shape;
  const char* name() const override { return "reshape"; }
  void backward(const Tensor& dy, GradSink& sink) override { sink.add(0, dy.view(input_shape)); }
};

// y = x in another dtype. dx = dy in x's dtype.
struct CastBackward : Node {
  DType input_dtype;
  const char* name() const override { return "cast"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    sink.add(0, to_dtype(dy, input_dtype));
  }
};

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  check::defined("cast", "input", x);
  if (should_record({&x}) && !is_floating(dtype)) {
    throw DTypeError(str_cat("[cast] ", x.describe(), " requires grad; casting it to ",
                             dtype_name(dtype), " would cut the gradient"));
  }
  Tensor out = to_dtype(x, dtype);
  if (dtype != x.dtype() && should_record({&x})) {
    auto node = std::make_unique<CastBackward>();
    node->input_dtype = x.dtype();
    record(std::move(node), {&x}, out);
  }
  return out;
}

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

Tensor gather_rows(const Tensor& src, const Tensor& index) {
  check::defined("gather_rows", "source", src);
  check::defined("gather_rows", "index", index);
  check::same_device("gather_rows", src, index);
  if (src.dim() < 1 || index.dtype() != DType::kInt32 || index.dim() != 1) {
    throw ShapeError(str_cat("[gather_rows] needs a source with rows and an int32 [M] index, got ",
                             src.describe(), " and ", index.describe()));
  }
  if (index.device().is_cpu()) {
    const int32_t* idx = index.data<int32_t>();
    for (int64_t i = 0; i < index.numel(); ++i) {
      if (idx[i] < 0 || idx[i] >= src.size(0)) {
        throw ValueError(str_cat("[gather_rows] index ", idx[i], " at position ", i,
                                 " is out of range for ", src.size(0), " rows"));
      }
    }
  }
  Shape shape = src.shape();
  shape[0] = index.numel();
  Tensor out = Tensor::empty(shape, src.dtype(), src.device());
  backend_for(src.device()).gather_rows(src, index, out);
  return out;
}

}  // namespace accrue
