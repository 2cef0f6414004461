// The names the public API gives the kernels' work: the element-wise ops (UnaryOp, BinaryOp,
// one value per functor of kernels/functors.h), the fused optimizer passes' and the loss
// scaling's arguments, and the ignored label. The math itself is internal (kernels/functors.h).
#pragma once

#include <cstdint>

// The element-wise op lists: X(Functor, EnumName). Each line gives an op its enum value and its
// case in the visitor that both backends run, so registering an activation here (after writing
// its functor pair in kernels/functors.h) is all the kernels need.
#define ACCRUE_UNARY_OPS(X) \
  X(Relu, kRelu)            \
  X(Tanh, kTanh)            \
  X(Gelu, kGelu)            \
  X(Sigmoid, kSigmoid)
#define ACCRUE_BINARY_OPS(X) \
  X(Add, kAdd)               \
  X(Sub, kSub)               \
  X(Mul, kMul)

namespace accrue {

namespace fn {
// The label of a target that is not one: a padded position of a sequence adds nothing to the
// loss and gets a zero gradient row (PyTorch's ignore_index default).
constexpr int32_t kIgnoreLabel = -100;
}  // namespace fn

// The arguments of the fused optimizer passes (kernels/functors.h AdamUpdate, SgdUpdate) and of the
// boundary scalars; optim/ fills them from its settings.
struct AdamArgs {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;  // AdamW: decay the parameter directly instead of adding it to the gradient
};
struct SgdArgs {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};
// Loss scaling (PyTorch's GradScaler semantics, once per window): after an overflowing
// window the scale is multiplied by backoff, after growth_interval clean windows in a row by
// growth. dynamic = false keeps the scale fixed (it still divides the gradient).
struct LossScaling {
  bool dynamic = false;
  double growth = 2.0, backoff = 0.5;
  int growth_interval = 2000;
};

#define ACCRUE_ENUM_VALUE(functor, value) value,
enum class UnaryOp { ACCRUE_UNARY_OPS(ACCRUE_ENUM_VALUE) };
enum class BinaryOp { ACCRUE_BINARY_OPS(ACCRUE_ENUM_VALUE) };
#undef ACCRUE_ENUM_VALUE

// "relu", "add", ...: for messages and traces (kernels/op_kinds.cpp).
const char* op_name(UnaryOp op);
const char* op_name(BinaryOp op);
// Whether the op's backward reads its output y (tanh) rather than its input x.
bool saves_output(UnaryOp op);

}  // namespace accrue
