// The public ops. Each validates its inputs (shape, dtype, device; errors name the op and the
// values), allocates its output, calls the device backend, and records a backward node on the
// tape when an input requires grad. Implementations live in ops/, one family per file. Read next:
// ops/autograd.h.
#pragma once

#include "core/geometry.h"
#include "core/tensor.h"
#include "kernels/factories.h"
#include "kernels/op_kinds.h"

namespace accrue {

// Element-wise (ops/elementwise.cpp). a and b have the same shape.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double alpha);
Tensor relu(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor gelu(const Tensor& x);
Tensor sigmoid(const Tensor& x);

// Linear algebra (ops/linear.cpp).
// a [M, K] @ b [K, N] -> [M, N]
Tensor matmul(const Tensor& a, const Tensor& b);
// Batched: a [B, M, K] @ b [B, K, N] -> [B, M, N]; with transpose_b, b is [B, N, K] and each
// matrix is multiplied by its transpose (attention's scores q @ k^T). One GEMM per matrix.
Tensor bmm(const Tensor& a, const Tensor& b, bool transpose_b = false);
// x [N, C] + bias [C] -> [N, C]
Tensor bias_add(const Tensor& x, const Tensor& bias);
// x [N, in] @ weight[out, in]^T + bias [out] -> [N, out]. bias may be undefined. The weight and
// bias gradients are accumulated straight into their grad buffers (GEMM beta = 1).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// relu(linear(x, weight, bias)) as one op: the bias and ReLU are applied to each GEMM block while
// it is in cache (CPU), the backward masks dy and sums the bias gradient in one pass, and only
// the output is kept for backward. Bitwise the same results as the two ops.
Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias);

// Reductions (ops/reduce.cpp): every element -> a 0-d tensor.
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// Softmax family (ops/softmax.cpp). logits [N, C]; labels int32 [N] in [0, C), or kIgnoreLabel.
Tensor log_softmax(const Tensor& logits);
enum class Reduction { kSum, kMean };
// A row labelled kIgnoreLabel (-100, PyTorch's ignore_index) adds nothing to the loss and gets
// a zero gradient: the padding of a batch of sequences.
using fn::kIgnoreLabel;
// Fused softmax cross-entropy. kSum is what gradient accumulation wants: seed backward with
// 1 / (targets in the window) and every micro-batch contributes exactly its share, whatever
// number of its rows are ignored. kMean divides by N, every row (ignored ones too).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                     Reduction reduction = Reduction::kSum);
// Attention's weights: scores [B, T, L] (query, key; T <= L) -> softmax over the keys of scale *
// scores, the T queries being the last T of the L positions (a decoder's new tokens after L - T
// cached ones; L = T in training), each seeing only the keys up to itself (the rest 0). Mask and
// scale are fused into the softmax and its backward (kernels/functors.h CausalSoftmax).
Tensor causal_softmax(const Tensor& scores, double scale);
// Index of the largest entry of each row: [N, C] -> int32 [N]. Not differentiable.
Tensor argmax(const Tensor& x);
// Number of equal entries of two int32 [N] tensors, as an int64 on the host.
int64_t count_equal(const Tensor& a, const Tensor& b);
// The same as an int32 0-d tensor on their device (no host read).
Tensor equal_count(const Tensor& a, const Tensor& b);

// Convolution and pooling, NCHW (ops/conv.cpp). conv2d: x [N, C, H, W], weight [O, C, KH,
// KW], bias [O] or undefined -> [N, O, OH, OW] (groups = 1). Pooling regions never cross planes;
// padding counts in the average (PyTorch's count_include_pad). flatten: [N, ...] -> [N, rest].
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const Conv2dGeometry& geometry = {});
Tensor max_pool2d(const Tensor& x, const Pool2dGeometry& geometry);
// max_pool2d(relu(x)) as one op, the same bits forward and backward (a maximum of ReLUs is the
// ReLU of the maximum), without the ReLU's passes over the full-size input and its gradient.
Tensor max_pool2d_relu(const Tensor& x, const Pool2dGeometry& geometry);
Tensor avg_pool2d(const Tensor& x, const Pool2dGeometry& geometry);
Tensor flatten(const Tensor& x);

// Normalisation and dropout (ops/norm.cpp), x [N, C, ...]. weight and bias may be
// undefined (no affine). group_norm: statistics per sample and group of C / groups channels,
// affine per channel. layer_norm: statistics per sample over everything but the batch
// dimension, affine per element (weight and bias with x's shape less the batch dimension).
// batch_norm: statistics per channel over the batch (training: the batch's, and running_mean /
// running_var, when defined, move by momentum with the unbiased variance, as PyTorch's; not
// training: the running statistics). A 16-bit x normalises in float32 (the statistics, the
// affine and the running statistics, which may be float32 or x's dtype). dropout: zeroes each
// element with probability key.p and scales the rest by 1 / (1 - p); the mask is a hash of the key,
// the row's sample index (samples, int32 [N]) and the element's index in its row.
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5);
// max_pool2d_relu(group_norm(x, ...), pool) for x [N, C, H, W] as one op, the same bits forward
// and backward, without the normalised activation and its gradient at full size in memory.
Tensor group_norm_relu_max_pool2d(const Tensor& x, int64_t groups, const Tensor& weight,
                                  const Tensor& bias, const Pool2dGeometry& pool,
                                  double eps = 1e-5);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, double momentum = 0.1, double eps = 1e-5);
Tensor dropout(const Tensor& x, const DropoutKey& key, const Tensor& samples);

// Shape, dtype and indexing (ops/shape.cpp).
// x converted to dtype (round to nearest even into 16 bits), recorded: the gradient comes back
// converted to x's dtype. The same tensor when the dtype is x's already.
Tensor cast(const Tensor& x, DType dtype);
// A recorded view with a new shape of the same element count.
Tensor reshape(const Tensor& x, const Shape& shape);
// x with its dimensions reordered: the output's dimension i is x's dimension dims[i] (at most
// 8), copied contiguous; recorded. select: x [N, ...] -> x[i] [...], a recorded view.
Tensor permute(const Tensor& x, const Shape& dims);
Tensor select(const Tensor& x, int64_t i);
// Rows of src [N, ...] picked by int32 index [M] -> [M, ...]. For data loading: not recorded.
Tensor gather_rows(const Tensor& src, const Tensor& index);
// An embedding lookup: weight [V, C], index int32 of any shape [...] -> [..., C], rows
// weight[index]. Backward adds dy's rows into dweight by index (the backend's index_add_rows:
// deterministic on every device); an index used twice gets the sum of both rows' gradients.
Tensor embedding(const Tensor& weight, const Tensor& index);

}  // namespace accrue
