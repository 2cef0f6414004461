// The public ops. Each validates its inputs (shape, dtype, device; errors name the op and the
// values), allocates its output, calls the device backend, and records a backward node on the
// tape when an input requires grad. Implementations live in core/ops/, one family per file.
#pragma once

#include "core/tensor.h"

namespace accrue {

// Element-wise (core/ops/elementwise.cpp). a and b have the same shape.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double alpha);
Tensor relu(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor gelu(const Tensor& x);
Tensor sigmoid(const Tensor& x);

// Linear algebra (core/ops/linear.cpp).
// a [M, K] @ b [K, N] -> [M, N]
Tensor matmul(const Tensor& a, const Tensor& b);
// x [N, C] + bias [C] -> [N, C]
Tensor bias_add(const Tensor& x, const Tensor& bias);
// x [N, in] @ weight[out, in]^T + bias [out] -> [N, out]. bias may be undefined. The weight and
// bias gradients are accumulated straight into their grad buffers (GEMM beta = 1).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// relu(linear(x, weight, bias)) as one op: the bias and ReLU are applied to each GEMM block while
// it is in cache (CPU), the backward masks dy and sums the bias gradient in one pass, and only
// the output is kept for backward. Bitwise the same results as the two ops.
Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias);

// Reductions (core/ops/reduce.cpp): every element -> a 0-d tensor.
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// Softmax family (core/ops/softmax.cpp). logits [N, C]; labels int32 [N] in [0, C).
Tensor log_softmax(const Tensor& logits);
enum class Reduction { kSum, kMean };
// Fused softmax cross-entropy. kSum is what gradient accumulation wants: seed backward with
// 1 / (samples in the window) and every micro-batch contributes exactly its share.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                     Reduction reduction = Reduction::kSum);
// Index of the largest entry of each row: [N, C] -> int32 [N]. Not differentiable.
Tensor argmax(const Tensor& x);
// Number of equal entries of two int32 [N] tensors, as an int64 on the host.
int64_t count_equal(const Tensor& a, const Tensor& b);

// Shape, dtype and indexing (core/ops/shape.cpp).
// x converted to dtype (round to nearest even into 16 bits), recorded: the gradient comes back
// converted to x's dtype. The same tensor when the dtype is x's already.
Tensor cast(const Tensor& x, DType dtype);
// A recorded view with a new shape of the same element count.
Tensor reshape(const Tensor& x, const Shape& shape);
// Rows of src [N, ...] picked by int32 index [M] -> [M, ...]. For data loading: not recorded.
Tensor gather_rows(const Tensor& src, const Tensor& index);

}  // namespace accrue
