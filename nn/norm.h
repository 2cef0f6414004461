// Normalisation and dropout modules with PyTorch's names and defaults. BatchNorm2d (eps 1e-5,
// momentum 0.1; weight = 1, bias = 0; buffers running_mean = 0, running_var = 1 and
// num_batches_tracked, saved and loaded but never trained) normalises with the batch's
// statistics in training mode and the running ones in evaluation mode. GroupNorm(groups,
// channels) and LayerNorm(normalized_shape) normalise each sample on its own, so accumulation
// stays exact with them; BatchNorm's statistics are the micro-batch's, so it does not.
// Dropout draws counter-based masks keyed by the samples a forward runs on (SampleKeys), so a
// sample gets the same mask however the window is split. Read next: examples/mnist/cnn.h.
#pragma once

#include <vector>

#include "core/geometry.h"
#include "nn/module.h"

namespace accrue::nn {

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& x) override;
  Tensor running_mean() const { return running_mean_; }
  Tensor running_var() const { return running_var_; }
  int64_t num_batches_tracked() const;

 private:
  int64_t features_;
  double eps_, momentum_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
  // The count mirrored on the host, and the buffer's storage version when it was last written
  // here (a load changes it: the count is then read back once).
  int64_t tracked_ = 0;
  uint64_t tracked_version_ = 0;
};

class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true,
            DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& x) override;
  // max_pool2d_relu(forward(x), pool) for x [N, C, H, W] as the one fused op (ops.h), the same
  // bits, as Linear::forward_relu is for its ReLU.
  Tensor forward_relu_max_pool(const Tensor& x, const Pool2dGeometry& pool);

 private:
  int64_t groups_, channels_;
  double eps_;
  Tensor weight_, bias_;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true, DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<int64_t> shape_;
  int64_t features_;
  double eps_;
  Tensor weight_, bias_;
};

// The samples a forward runs on, for Dropout: open one around each micro-step's forward with
// the step (the optimizer step the window belongs to) and the samples' indices in the dataset
// (int32 [micro-batch], on the data's device). Nested: the innermost wins.
class SampleKeys {
 public:
  SampleKeys(uint64_t seed, int64_t step, Tensor samples);
  ~SampleKeys();
  SampleKeys(const SampleKeys&) = delete;
  SampleKeys& operator=(const SampleKeys&) = delete;
  static const SampleKeys* current();
  uint64_t seed() const { return seed_; }
  int64_t step() const { return step_; }
  const Tensor& samples() const { return samples_; }

 private:
  uint64_t seed_;
  int64_t step_;
  Tensor samples_;
  const SampleKeys* previous_;
};

class Dropout : public Module {
 public:
  // salt tells the dropout layers of one model apart (give each a different one).
  explicit Dropout(double p = 0.5, uint64_t salt = 0);
  Tensor forward(const Tensor& x) override;

 private:
  double p_;
  uint64_t salt_;
};

}  // namespace accrue::nn
