// reshape: a view with a new shape, recorded so gradients flow back in the input's shape.
// gather_rows: row selection for building micro-batches from a shuffled dataset.
// embedding: the same gather, recorded: its backward adds the gradient's rows back by index.
// cast: a recorded dtype conversion (mixed precision: 16-bit logits to float32 for the loss).
// permute and select: attention's head split (qkv [B, T, 3, H, D] -> q, k, v [B, H, T, D]) and
// merge, recorded.
#include <memory>

#include "kernels/backend.h"
#include "kernels/functors.h"
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
// order (index_add_rows); a 16-bit table's rows are summed in float32, and reach a float32
// gradient buffer (mixed precision's) as they are, else rounded once to the table's dtype.
struct EmbeddingBackward : Node {
  Tensor index;  // int32, flat [N]
  Shape weight_shape;
  const char* name() const override { return "embedding"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    const DType sum_dtype = is_half(dy.dtype()) ? DType::kFloat32 : dy.dtype();
    Tensor dweight = Tensor::zeros(weight_shape, sum_dtype, dy.device());
    const int64_t n = index.numel();
    backend_for(dy.device())
        .index_add_rows(to_dtype(dy, sum_dtype).view({n, weight_shape[1]}), index, dweight);
    sink.add_sums(0, dweight, dy.dtype());  // no copy when the dtypes agree
  }
};

// y = x.permute(dims). dx = dy.permute(inverse of dims).
struct PermuteBackward : Node {
  Shape inverse;
  const char* name() const override { return "permute"; }
  void backward(const Tensor& dy, GradSink& sink) override { sink.add(0, permute(dy, inverse)); }
};

// y = x[i] along dimension 0. dx = zeros with dy in row i.
struct SelectBackward : Node {
  Shape input_shape;
  int64_t i = 0;
  const char* name() const override { return "select"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor dx = Tensor::zeros(input_shape, dy.dtype(), dy.device());
    Tensor row = dx.narrow(i, 1);
    backend_for(dy.device()).copy(dy.view(row.shape()), row);
    sink.add(0, dx);
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

Tensor permute(const Tensor& x, const Shape& dims) {
  check::defined("permute", "input", x);
  const size_t rank = static_cast<size_t>(x.dim());
  std::vector<bool> seen(rank, false);
  bool valid = dims.size() == rank && rank <= static_cast<size_t>(fn::PermuteIndex::kMaxDims);
  for (size_t i = 0; valid && i < dims.size(); ++i) {
    valid = dims[i] >= 0 && dims[i] < static_cast<int64_t>(rank) && !seen[dims[i]];
    if (valid) seen[dims[i]] = true;
  }
  if (!valid) {
    throw ShapeError(str_cat("[permute] dims ", shape_str(dims), " are not a permutation of the ",
                             rank, " dimensions of ", x.describe(), " (at most ",
                             fn::PermuteIndex::kMaxDims, ")"));
  }
  Shape shape(rank), inverse(rank);
  for (size_t i = 0; i < rank; ++i) {
    shape[i] = x.size(static_cast<int64_t>(dims[i]));
    inverse[static_cast<size_t>(dims[i])] = static_cast<int64_t>(i);
  }
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  backend_for(x.device()).permute(x, dims, out);
  if (should_record({&x})) {
    auto node = std::make_unique<PermuteBackward>();
    node->inverse = inverse;
    record(std::move(node), {&x}, out);
  }
  return out;
}

Tensor select(const Tensor& x, int64_t i) {
  check::defined("select", "input", x);
  if (x.dim() < 1 || i < 0 || i >= x.size(0)) {
    throw ShapeError(str_cat("[select] index ", i, " is out of range for ", x.describe()));
  }
  const Shape shape(x.shape().begin() + 1, x.shape().end());
  Tensor out = x.narrow(i, 1).view(shape);
  if (should_record({&x})) {
    auto node = std::make_unique<SelectBackward>();
    node->input_shape = x.shape();
    node->i = i;
    record(std::move(node), {&x}, out);
  }
  return out;
}

}  // namespace accrue
