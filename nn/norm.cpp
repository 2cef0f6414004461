// Normalisation and dropout modules (see norm.h).
#include "nn/norm.h"

#include "core/graph.h"

#include "kernels/profile.h"
#include "ops/ops.h"

namespace accrue::nn {

namespace {

thread_local const SampleKeys* current_keys = nullptr;

void check_eps(const char* name, double eps) {
  if (!(eps > 0)) throw ValueError(str_cat("[", name, "] eps must be > 0, got ", eps));
}

}  // namespace

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum, bool affine,
                         DType dtype)
    : features_(num_features), eps_(eps), momentum_(momentum) {
  if (num_features <= 0) {
    throw ValueError(str_cat("[BatchNorm2d] num_features must be positive, got ", num_features));
  }
  check_eps("BatchNorm2d", eps);
  if (!(momentum >= 0 && momentum <= 1)) {
    throw ValueError(str_cat("[BatchNorm2d] momentum must be in [0, 1], got ", momentum));
  }
  if (affine) {
    weight_ = register_parameter("weight", full({num_features}, 1.0, dtype));
    bias_ = register_parameter("bias", Tensor::zeros({num_features}, dtype));
  }
  running_mean_ = register_buffer("running_mean", Tensor::zeros({num_features}, dtype));
  running_var_ = register_buffer("running_var", full({num_features}, 1.0, dtype));
  // int64, as PyTorch keeps it, so that its state_dict files load and accrue's load there as
  // they are (load_parameters also reads an int32 counter from older accrue files).
  num_batches_tracked_ = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::kInt64));
  tracked_version_ = num_batches_tracked_.impl()->storage->version();
}

int64_t BatchNorm2d::num_batches_tracked() const {
  return num_batches_tracked_.to_vector<int64_t>()[0];
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  if (x.dim() != 4 || x.size(1) != features_) {
    throw ShapeError(str_cat("[BatchNorm2d] expects [N, ", features_, ", H, W], got shape ",
                             shape_str(x.shape())));
  }
  if (is_training()) {
    if (graph_capturing(x.device())) {
      // The counter is written from the host's count: a replay would write the captured value.
      throw NotCapturable(
          "[BatchNorm2d] cannot be captured in a CUDA graph in training: num_batches_tracked is "
          "counted on the host (--cuda-graphs off runs it eagerly)");
    }
    if (num_batches_tracked_.impl()->storage->version() != tracked_version_) {
      tracked_ = num_batches_tracked_.to_vector<int64_t>()[0];  // loaded since: read once
    }
    fill_(num_batches_tracked_, static_cast<double>(++tracked_));
    tracked_version_ = num_batches_tracked_.impl()->storage->version();
  }
  return batch_norm(x, weight_, bias_, running_mean_, running_var_, is_training(), momentum_, eps_);
}

GroupNorm::GroupNorm(int64_t num_groups, int64_t num_channels, double eps, bool affine, DType dtype)
    : groups_(num_groups), channels_(num_channels), eps_(eps) {
  if (num_groups <= 0 || num_channels <= 0 || num_channels % num_groups != 0) {
    throw ValueError(str_cat("[GroupNorm] ", num_channels, " channels do not split into ",
                             num_groups, " groups"));
  }
  check_eps("GroupNorm", eps);
  if (affine) {
    weight_ = register_parameter("weight", full({num_channels}, 1.0, dtype));
    bias_ = register_parameter("bias", Tensor::zeros({num_channels}, dtype));
  }
}

Tensor GroupNorm::forward(const Tensor& x) {
  if (x.dim() < 2 || x.size(1) != channels_) {
    throw ShapeError(
        str_cat("[GroupNorm] expects [N, ", channels_, ", ...], got shape ", shape_str(x.shape())));
  }
  return group_norm(x, groups_, weight_, bias_, eps_);
}

Tensor GroupNorm::forward_relu_max_pool(const Tensor& x, const Pool2dGeometry& pool) {
  if (x.dim() != 4 || x.size(1) != channels_) {
    throw ShapeError(str_cat("[GroupNorm] fused with pooling expects [N, ", channels_,
                             ", H, W], got shape ", shape_str(x.shape())));
  }
  const ProfileScope scope(profile_scope());
  return group_norm_relu_max_pool2d(x, groups_, weight_, bias_, pool, eps_);
}

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine,
                     DType dtype)
    : shape_(std::move(normalized_shape)), features_(1), eps_(eps) {
  for (int64_t d : shape_) {
    if (d <= 0) throw ValueError(str_cat("[LayerNorm] normalized_shape ", shape_str(shape_)));
    features_ *= d;
  }
  if (shape_.empty()) throw ValueError("[LayerNorm] normalized_shape is empty");
  check_eps("LayerNorm", eps);
  if (elementwise_affine) {
    weight_ = register_parameter("weight", full(shape_, 1.0, dtype));
    bias_ = register_parameter("bias", Tensor::zeros(shape_, dtype));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  // The last dimensions must be normalized_shape; the ones before are rows.
  const size_t k = shape_.size();
  bool match = static_cast<size_t>(x.dim()) > k;
  for (size_t i = 0; match && i < k; ++i) match = x.size(x.dim() - k + i) == shape_[i];
  if (!match) {
    throw ShapeError(str_cat("[LayerNorm] expects [..., ", shape_str(shape_).substr(1),
                             " (at least one leading dimension), got shape ",
                             shape_str(x.shape())));
  }
  const int64_t rows = x.numel() / features_;
  return reshape(layer_norm(reshape(x, {rows, features_}), weight_, bias_, eps_), x.shape());
}

SampleKeys::SampleKeys(uint64_t seed, int64_t step, Tensor samples)
    : seed_(seed), step_(step), samples_(std::move(samples)), previous_(current_keys) {
  current_keys = this;
}

SampleKeys::~SampleKeys() {
  current_keys = previous_;
}

const SampleKeys* SampleKeys::current() {
  return current_keys;
}

Dropout::Dropout(double p, uint64_t salt) : p_(p), salt_(salt) {
  if (!(p >= 0 && p < 1)) throw ValueError(str_cat("[Dropout] p must be in [0, 1), got ", p));
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p_ == 0) return x;
  const SampleKeys* keys = SampleKeys::current();
  if (keys == nullptr) {
    throw ValueError(
        "[Dropout] training mode needs the samples' keys: open an nn::SampleKeys(seed, step, "
        "sample indices) around the forward (or call eval())");
  }
  const DropoutKey key{p_, keys->seed() ^ (0x9e3779b97f4a7c15ull * (salt_ + 1)), keys->step()};
  return dropout(x, key, keys->samples());
}

}  // namespace accrue::nn
