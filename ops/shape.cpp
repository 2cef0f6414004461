// reshape: a view with a new shape, recorded so gradients flow back in the input's shape.
// gather_rows: row selection for building micro-batches from a shuffled dataset.
// embedding: the same gather, recorded: its backward adds the gradient's rows back by index.
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

// y [..., C] = weight[index]. dweight [V, C] = the rows of dy added at their index, in a fixed
// order (index_add_rows).
struct EmbeddingBackward : Node {
  Tensor index;  // int32, flat [N]
  Shape weight_shape;
  const char* name() const override { return "embedding"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor dweight = Tensor::zeros(weight_shape, dy.dtype(), dy.device());
    const int64_t n = index.numel();
    backend_for(dy.device()).index_add_rows(dy.view({n, weight_shape[1]}), index, dweight);
    sink.add(0, dweight);
  }
};

// Every entry of a host-resident int32 index [N] names one of `rows` rows (one on a device is
// checked by the kernels, which record a fault instead of reading out of bounds).
void check_row_index(const char* op, const Tensor& index, int64_t rows) {
  if (!index.device().is_cpu()) return;
  const int32_t* idx = index.data<int32_t>();
  for (int64_t i = 0; i < index.numel(); ++i) {
    if (idx[i] < 0 || idx[i] >= rows) {
      throw ValueError(str_cat("[", op, "] index ", idx[i], " at position ", i,
                               " is out of range for ", rows, " rows"));
    }
  }
}

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
  check_row_index("gather_rows", index, src.size(0));
  Shape shape = src.shape();
  shape[0] = index.numel();
  Tensor out = Tensor::empty(shape, src.dtype(), src.device());
  backend_for(src.device()).gather_rows(src, index, out);
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& index) {
  check::defined("embedding", "weight", weight);
  check::floating("embedding", "weight", weight);
  check::defined("embedding", "index", index);
  check::same_device("embedding", weight, index);
  if (weight.dim() != 2 || index.dtype() != DType::kInt32) {
    throw ShapeError(str_cat("[embedding] needs a weight [V, C] and an int32 index, got ",
                             weight.describe(), " and ", index.describe()));
  }
  if (is_half(weight.dtype())) {  // index_add_rows adds in float32 and float64 so far
    throw DTypeError(str_cat("[embedding] a 16-bit table is not supported yet, got ",
                             weight.describe(), " (float32 or float64)"));
  }
  const Tensor flat = index.view({index.numel()});
  check_row_index("embedding", flat, weight.size(0));
  Shape shape = index.shape();
  shape.push_back(weight.size(1));
  Tensor out = gather_rows(weight, flat).view(shape);
  if (should_record({&weight})) {
    auto node = std::make_unique<EmbeddingBackward>();
    node->index = node->save(flat);
    node->weight_shape = weight.shape();
    record(std::move(node), {&weight}, out);
  }
  return out;
}

}  // namespace accrue
