// matmul, bmm (batched), bias_add, linear and linear_relu, with backward nodes that accumulate the
// parameter gradients in place: when an input is a leaf (a parameter), its gradient GEMM writes
// into the leaf's grad buffer with beta = 1, and its bias gradient is a row-sum added into the
// buffer. No temporary gradient tensor and no separate "add into .grad" pass exist for parameters.
// Read next: optim/arena.h.
#include <memory>

#include "kernels/backend.h"
#include "ops/autograd.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace accrue {

namespace {

// out = op(a) @ op(b) + beta * out for every matrix of a batch [B, M, N], or for one matrix.
void batched_gemm(Backend& be, bool trans_a, bool trans_b, const Tensor& a, const Tensor& b,
                  double beta, Tensor out) {
  if (out.dim() == 3) {
    be.gemm_batched(trans_a, trans_b, 1.0, a, b, beta, out);
  } else {
    be.gemm(trans_a, trans_b, 1.0, a, b, beta, out);
  }
}

// Input i's gradient (of `shape`: [rows, cols], or [B, rows, cols]) += op(a) @ op(b).
void add_gemm(GradSink& sink, size_t i, bool trans_a, bool trans_b, const Tensor& a,
              const Tensor& b, const Shape& shape) {
  if (!sink.needs(i)) return;
  Backend& be = backend_for(a.device());
  Tensor acc = sink.grad_buffer(i);
  if (acc.defined()) {
    batched_gemm(be, trans_a, trans_b, a, b, 1.0, acc);
    return;
  }
  Tensor g = Tensor::empty(shape, a.dtype(), a.device());
  batched_gemm(be, trans_a, trans_b, a, b, 0.0, g);
  sink.add(i, g);
}

// Input i's gradient [C] += sum over rows of dy [N, C].
void add_row_sum(GradSink& sink, size_t i, const Tensor& dy) {
  if (!sink.needs(i)) return;
  Backend& be = backend_for(dy.device());
  Tensor acc = sink.grad_buffer(i);
  if (acc.defined()) {
    be.sum_rows(dy, 1.0, 1.0, acc);
    return;
  }
  Tensor g = Tensor::empty({dy.size(1)}, dy.dtype(), dy.device());
  be.sum_rows(dy, 1.0, 0.0, g);
  sink.add(i, g);
}

// y = a @ b. da = dy @ b^T, db = a^T @ dy.
struct MatmulBackward : Node {
  Tensor a;  // [M, K]
  Tensor b;  // [K, N]
  const char* name() const override { return "matmul"; }
  void backward(const Tensor& dy, GradSink& sink) override {  // dy [M, N]
    add_gemm(sink, 0, false, true, dy, b, a.shape());
    add_gemm(sink, 1, true, false, a, dy, b.shape());
  }
};

// y [B, M, N] = a [B, M, K] @ b [B, K, N], or @ b^T for b [B, N, K] (transpose_b).
// Without transpose: da = dy @ b^T, db = a^T @ dy. With: da = dy @ b, db = dy^T @ a.
struct BmmBackward : Node {
  Tensor a, b;
  bool transpose_b = false;
  const char* name() const override { return "bmm"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    if (transpose_b) {
      add_gemm(sink, 0, false, false, dy, b, a.shape());
      add_gemm(sink, 1, true, false, dy, a, b.shape());
    } else {
      add_gemm(sink, 0, false, true, dy, b, a.shape());
      add_gemm(sink, 1, true, false, a, dy, b.shape());
    }
  }
};

// y = x + bias. dx = dy, dbias = rowsum(dy).
struct BiasAddBackward : Node {
  const char* name() const override { return "bias_add"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    sink.add(0, dy);
    add_row_sum(sink, 1, dy);
  }
};

// y = x @ w^T + bias. dx = dy @ w, dw += dy^T @ x, dbias += rowsum(dy).
struct LinearBackward : Node {
  Tensor x;  // [N, in]
  Tensor w;  // [out, in]
  const char* name() const override { return "linear"; }
  void backward(const Tensor& dy, GradSink& sink) override {  // dy [N, out]
    add_gemm(sink, 0, false, false, dy, w, x.shape());
    add_gemm(sink, 1, true, false, dy, x, w.shape());
    add_row_sum(sink, 2, dy);
  }
};

// y = relu(x @ w^T + bias), one node. dz = dy * (y > 0) with dbias += rowsum(dz) in the same
// pass, then dx = dz @ w and dw += dz^T @ x. It saves y, which the next layer saves as its
// input anyway, where linear + relu would also keep the pre-activation.
struct LinearReluBackward : Node {
  Tensor x;  // [N, in]
  Tensor w;  // [out, in]
  Tensor y;  // [N, out], the output
  const char* name() const override { return "linear_relu"; }
  void backward(const Tensor& dy, GradSink& sink) override {  // dy [N, out]
    Backend& be = backend_for(dy.device());
    Tensor dz = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    Tensor dbias = sink.needs(2) ? sink.grad_buffer(2) : Tensor();
    if (sink.needs(2) && !dbias.defined()) {
      Tensor g = Tensor::empty({dy.size(1)}, dy.dtype(), dy.device());
      be.relu_bias_backward(y, dy, dz, 0.0, g);
      sink.add(2, g);
    } else {
      be.relu_bias_backward(y, dy, dz, 1.0, dbias);
    }
    add_gemm(sink, 0, false, false, dz, w, x.shape());
    add_gemm(sink, 1, true, false, dz, x, w.shape());
  }
};

// The checks and the forward shared by linear and linear_relu.
Tensor linear_forward(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      bool relu) {
  check::compatible(op, x, weight);
  check::rank(op, "weight", weight, 2);
  if (x.dim() != 2) {
    throw ShapeError(str_cat("[", op, "] input must be 2-D [batch, in_features], got shape ",
                             shape_str(x.shape())));
  }
  if (x.size(1) != weight.size(1)) {
    throw ShapeError(str_cat("[", op, "] input has shape ", shape_str(x.shape()),
                             " but weight expects in_features = ", weight.size(1)));
  }
  if (bias.defined()) {
    check::compatible(op, x, bias);
    if (bias.dim() != 1 || bias.size(0) != weight.size(0)) {
      throw ShapeError(str_cat("[", op, "] bias has shape ", shape_str(bias.shape()),
                               " but weight has out_features = ", weight.size(0)));
    }
  }
  Tensor out = Tensor::empty({x.size(0), weight.size(0)}, x.dtype(), x.device());
  backend_for(x.device()).linear_forward(x, weight, bias, relu, out);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check::compatible("matmul", a, b);
  check::rank("matmul", "first input", a, 2);
  check::rank("matmul", "second input", b, 2);
  if (a.size(1) != b.size(0)) {
    throw ShapeError(str_cat("[matmul] inner dimensions differ: ", shape_str(a.shape()), " @ ",
                             shape_str(b.shape())));
  }
  Tensor out = Tensor::empty({a.size(0), b.size(1)}, a.dtype(), a.device());
  backend_for(a.device()).gemm(false, false, 1.0, a, b, 0.0, out);
  if (should_record({&a, &b})) {
    auto node = std::make_unique<MatmulBackward>();
    node->a = node->save(a);
    node->b = node->save(b);
    record(std::move(node), {&a, &b}, out);
  }
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b, bool transpose_b) {
  check::compatible("bmm", a, b);
  check::rank("bmm", "first input", a, 3);
  check::rank("bmm", "second input", b, 3);
  const int64_t inner = transpose_b ? b.size(2) : b.size(1);
  if (a.size(0) != b.size(0) || a.size(2) != inner) {
    throw ShapeError(str_cat("[bmm] ", shape_str(a.shape()), " @ ", shape_str(b.shape()),
                             transpose_b ? "^T" : "", ": the batches or inner dimensions differ"));
  }
  Tensor out = Tensor::empty({a.size(0), a.size(1), transpose_b ? b.size(1) : b.size(2)}, a.dtype(),
                             a.device());
  batched_gemm(backend_for(a.device()), false, transpose_b, a, b, 0.0, out);
  if (should_record({&a, &b})) {
    auto node = std::make_unique<BmmBackward>();
    node->a = node->save(a);
    node->b = node->save(b);
    node->transpose_b = transpose_b;
    record(std::move(node), {&a, &b}, out);
  }
  return out;
}

Tensor bias_add(const Tensor& x, const Tensor& bias) {
  check::compatible("bias_add", x, bias);
  check::rank("bias_add", "input", x, 2);
  check::rank("bias_add", "bias", bias, 1);
  if (bias.size(0) != x.size(1)) {
    throw ShapeError(str_cat("[bias_add] input has shape ", shape_str(x.shape()),
                             " but bias has shape ", shape_str(bias.shape())));
  }
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).bias_add(x, bias, out);
  if (should_record({&x, &bias})) record(std::make_unique<BiasAddBackward>(), {&x, &bias}, out);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor out = linear_forward("linear", x, weight, bias, false);
  if (should_record({&x, &weight, &bias})) {
    auto node = std::make_unique<LinearBackward>();
    node->x = node->save(x);
    node->w = node->save(weight);
    record(std::move(node), {&x, &weight, &bias}, out);
  }
  return out;
}

Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor out = linear_forward("linear_relu", x, weight, bias, true);
  if (should_record({&x, &weight, &bias})) {
    auto node = std::make_unique<LinearReluBackward>();
    node->x = node->save(x);
    node->w = node->save(weight);
    node->y = node->save(out.view(out.shape()));  // a view: the node must not own its output
    record(std::move(node), {&x, &weight, &bias}, out);
  }
  return out;
}

}  // namespace accrue
