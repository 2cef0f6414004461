// Element-wise ops and their backward nodes. The math is in kernels/functors.h; here are only
// the checks, the output allocation and the tape records.
#include <memory>

#include "kernels/backend.h"
#include "ops/autograd.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace accrue {

namespace {

// dx = op'(saved) * dy, saved being x or y as the op's functor says (kernels/functors.h).
struct UnaryBackward : Node {
  UnaryOp op;
  Tensor saved;  // [any]
  const char* name() const override { return op_name(op); }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    backend_for(dy.device()).unary_backward(op, saved, dy, dx);
    sink.add(0, dx);
  }
};

// dx = alpha * dy; nothing saved.
struct ScaleBackward : Node {
  double alpha;
  const char* name() const override { return "scale"; }
  void backward(const Tensor& dy, GradSink& sink) override { sink.add(0, scale(dy, alpha)); }
};

// add: da = dy, db = dy. sub: da = dy, db = -dy.
struct AddBackward : Node {
  bool subtract;
  const char* name() const override { return subtract ? "sub" : "add"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    sink.add(0, dy);
    if (sink.needs(1)) sink.add(1, subtract ? scale(dy, -1.0) : dy);
  }
};

// da = dy * b, db = dy * a.
struct MulBackward : Node {
  Tensor a, b;  // [any], same shape
  const char* name() const override { return "mul"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    if (sink.needs(0)) sink.add(0, mul(dy, b));
    if (sink.needs(1)) sink.add(1, mul(dy, a));
  }
};

Tensor unary(UnaryOp op, const Tensor& x) {
  check::floating(op_name(op), "input", x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).unary(op, x, y);
  if (should_record({&x})) {
    auto node = std::make_unique<UnaryBackward>();
    node->op = op;
    node->saved = node->save(saves_output(op) ? y.view(y.shape()) : x);
    record(std::move(node), {&x}, y);
  }
  return y;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  check::compatible(name, a, b);
  if (a.shape() != b.shape()) {
    throw ShapeError(str_cat("[", name, "] shapes differ: ", shape_str(a.shape()), " and ",
                             shape_str(b.shape()),
                             " (no broadcasting; use bias_add for [N, C] + [C])"));
  }
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  backend_for(a.device()).binary(op, a, b, out);
  if (should_record({&a, &b})) {
    if (op == BinaryOp::kMul) {
      auto node = std::make_unique<MulBackward>();
      node->a = node->save(a);
      node->b = node->save(b);
      record(std::move(node), {&a, &b}, out);
    } else {
      auto node = std::make_unique<AddBackward>();
      node->subtract = op == BinaryOp::kSub;
      record(std::move(node), {&a, &b}, out);
    }
  }
  return out;
}

}  // namespace

Tensor relu(const Tensor& x) {
  return unary(UnaryOp::kRelu, x);
}
Tensor tanh(const Tensor& x) {
  return unary(UnaryOp::kTanh, x);
}
Tensor sigmoid(const Tensor& x) {
  return unary(UnaryOp::kSigmoid, x);
}
Tensor gelu(const Tensor& x) {
  return unary(UnaryOp::kGelu, x);
}
Tensor scale(const Tensor& x, double alpha) {
  check::floating("scale", "input", x);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).scale(alpha, x, y);
  if (should_record({&x})) {
    auto node = std::make_unique<ScaleBackward>();
    node->alpha = alpha;
    record(std::move(node), {&x}, y);
  }
  return y;
}
Tensor add(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::kAdd, a, b);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::kSub, a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::kMul, a, b);
}

}  // namespace accrue
