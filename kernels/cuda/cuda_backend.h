// The CUDA backend: every primitive of kernels/backend.h on one GPU, all on the device's stream
// (context.h). Element-wise math is kernels/functors.h through launch.cuh; GEMM is cuBLAS;
// block reductions use CUB. One family per file: elementwise.cu, index.cu, reduce.cu, gemm.cu,
// softmax.cu, optim.cu.
#pragma once

#include "kernels/backend.h"

namespace accrue::cuda {

class CudaBackend final : public Backend {
 public:
  void fill(Tensor& out, double value) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void cast(const Tensor& src, Tensor& dst) override;
  void gather_rows(const Tensor& src, const Tensor& index, Tensor& out) override;
  void unary(UnaryOp op, const Tensor& x, double alpha, Tensor& y) override;
  void unary_backward(UnaryOp op, const Tensor& saved, const Tensor& dy, Tensor& dx) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void axpy(double alpha, const Tensor& x, Tensor& y) override;
  void bias_add(const Tensor& x, const Tensor& b, Tensor& y) override;
  void sum_rows(const Tensor& x, double alpha, double beta, Tensor& out) override;
  void sum_all(const Tensor& x, Tensor& out) override;
  void expand_scalar(const Tensor& s, double alpha, Tensor& out) override;
  void gemm(bool trans_a, bool trans_b, double alpha, const Tensor& a, const Tensor& b, double beta,
            Tensor& c) override;
  void log_softmax(const Tensor& x, Tensor& y) override;
  void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void cross_entropy(const Tensor& logits, const Tensor& labels, Tensor& loss,
                     Tensor& probs) override;
  void cross_entropy_backward(const Tensor& probs, const Tensor& labels, const Tensor& dloss,
                              Tensor& dlogits) override;
  void argmax(const Tensor& x, Tensor& index) override;
  void count_equal(const Tensor& a, const Tensor& b, Tensor& out) override;
  void norm_sq(const Tensor& g, Tensor& out) override;
  void boundary(const Tensor& norm_sq, double normalize, double max_norm, Tensor& out,
                Tensor& steps) override;
  void adam_step(const AdamParams& hp, const Tensor& boundary, const Tensor& steps, Tensor& param,
                 Tensor& grad, Tensor& m, Tensor& v) override;
  void sgd_step(const SgdParams& hp, const Tensor& boundary, const Tensor& steps, Tensor& param,
                Tensor& grad, Tensor& momentum) override;
};

}  // namespace accrue::cuda
