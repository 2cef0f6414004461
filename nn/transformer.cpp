// The GPT's layers (see transformer.h). Shapes: B sequences of T tokens, width C, H heads of
// D = C / H.
#include "nn/transformer.h"

#include <cmath>

#include "nn/init.h"
#include "ops/autograd.h"
#include "ops/ops.h"

namespace accrue::nn {

Embedding::Embedding(int64_t num, int64_t dim, DType dtype) {
  if (num <= 0 || dim <= 0) {
    throw ShapeError(str_cat("[Embedding] sizes must be positive, got ", num, " x ", dim));
  }
  weight_ = register_parameter("weight", normal({num, dim}, 0.0, 1.0, generator(), dtype));
}

Tensor Embedding::forward(const Tensor& index) {
  return embedding(weight_, index);
}

namespace {

void check_config(const GPTConfig& c) {
  if (c.vocab_size <= 0 || c.block_size <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_embd <= 0 ||
      c.n_embd % c.n_head != 0) {
    throw ValueError(
        str_cat("[GPT] needs positive sizes and n_embd divisible by n_head, got "
                "vocab_size ",
                c.vocab_size, ", block_size ", c.block_size, ", n_layer ", c.n_layer, ", n_head ",
                c.n_head, ", n_embd ", c.n_embd));
  }
}

void check_sequence(const char* op, const Tensor& x, int64_t width) {
  if (x.dim() != 3 || x.size(2) != width) {
    throw ShapeError(str_cat("[", op, "] expects [B, T, ", width, "], got ", x.describe()));
  }
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c, DType dtype)
    : n_head_(c.n_head), n_embd_(c.n_embd) {
  c_attn_ =
      register_module("c_attn", std::make_shared<Linear>(c.n_embd, 3 * c.n_embd, true, dtype));
  c_proj_ = register_module("c_proj", std::make_shared<Linear>(c.n_embd, c.n_embd, true, dtype));
}

Tensor CausalSelfAttention::heads(const Tensor& qkv, int64_t b, int64_t t) const {
  // [B T, 3C] -> [B, T, 3, H, D] -> [3, B, H, T, D]: q, k, v as B H matrices [T, D] each
  const int64_t h = n_head_, d = n_embd_ / h;
  return reshape(permute(reshape(qkv, {b, t, 3, h, d}), {2, 0, 3, 1, 4}), {3, b * h, t, d});
}

Tensor CausalSelfAttention::merge(const Tensor& y, int64_t b, int64_t t) {
  // [B, H, T, D] -> [B, T, H, D] = [B T, C]
  const int64_t c = n_embd_, h = n_head_, d = c / h;
  const Tensor merged = reshape(permute(reshape(y, {b, h, t, d}), {0, 2, 1, 3}), {b * t, c});
  return reshape((*c_proj_)(merged), {b, t, c});
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  check_sequence("CausalSelfAttention", x, n_embd_);
  const int64_t b = x.size(0), t = x.size(1), d = n_embd_ / n_head_;
  const Tensor projected = (*c_attn_)(reshape(x, {b * t, n_embd_}));  // [B T, 3C]
  const Tensor qkv = heads(projected, b, t);
  const Tensor q = select(qkv, 0), k = select(qkv, 1), v = select(qkv, 2);
  const Tensor weights = causal_softmax(bmm(q, k, true), 1.0 / std::sqrt(double(d)));  // [BH,T,T]
  return merge(bmm(weights, v), b, t);                                                 // [BH,T,D]
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, int64_t start, Tensor& keys,
                                           Tensor& values) {
  check_sequence("CausalSelfAttention", x, n_embd_);
  const NoGradGuard no_grad;
  const int64_t b = x.size(0), t = x.size(1), h = n_head_, d = n_embd_ / h, length = start + t;
  const Tensor qkv = heads((*c_attn_)(reshape(x, {b * t, n_embd_})), b, t);
  // The new keys and values [B H, T, D] into the cache's positions [start, start + T), which is
  // position-major; then the first `length` positions back as [B H, length, D].
  keys.narrow(start, t).copy_(permute(select(qkv, 1), {1, 0, 2}));
  values.narrow(start, t).copy_(permute(select(qkv, 2), {1, 0, 2}));
  const Tensor k = permute(keys.narrow(0, length), {1, 0, 2});
  const Tensor v = permute(values.narrow(0, length), {1, 0, 2});
  // [B H, T, length]: the T queries are the last T of the length positions
  const Tensor weights = causal_softmax(bmm(select(qkv, 0), k, true), 1.0 / std::sqrt(double(d)));
  return merge(bmm(weights, v), b, t);
}

Block::Block(const GPTConfig& c, DType dtype) {
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5, true, dtype));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(c, dtype));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5, true, dtype));
  c_fc_ =
      register_module("mlp.c_fc", std::make_shared<Linear>(c.n_embd, 4 * c.n_embd, true, dtype));
  c_proj_ =
      register_module("mlp.c_proj", std::make_shared<Linear>(4 * c.n_embd, c.n_embd, true, dtype));
}

// The attention's sum is named so that its temporaries (ln_1's output, the attention's) are
// freed before the MLP runs, not at the end of one long expression.
Tensor Block::forward(const Tensor& x) {
  const Tensor a = add(x, (*attn_)((*ln_1_)(x)));
  return mlp_residual(a);
}

Tensor Block::forward_cached(const Tensor& x, int64_t start, Tensor& keys, Tensor& values) {
  const Tensor a = add(x, attn_->forward_cached((*ln_1_)(x), start, keys, values));
  return mlp_residual(a);
}

Tensor Block::mlp_residual(const Tensor& a) {
  const int64_t b = a.size(0), t = a.size(1), c = a.size(2);
  const Tensor hidden = gelu((*c_fc_)(reshape((*ln_2_)(a), {b * t, c})));
  return add(a, reshape((*c_proj_)(hidden), {b, t, c}));
}

GPT::GPT(const GPTConfig& c, DType dtype) : config_(c) {
  check_config(c);
  wte_ = register_module("transformer.wte",
                         std::make_shared<Embedding>(c.vocab_size, c.n_embd, dtype));
  wpe_ = register_module("transformer.wpe",
                         std::make_shared<Embedding>(c.block_size, c.n_embd, dtype));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    blocks_.push_back(
        register_module(str_cat("transformer.h.", i), std::make_shared<Block>(c, dtype)));
  }
  ln_f_ = register_module("transformer.ln_f",
                          std::make_shared<LayerNorm>(Shape{c.n_embd}, 1e-5, true, dtype));
  // nanoGPT's _init_weights, in parameter order: every Linear and Embedding weight normal(0,
  // 0.02), the residual projections' (c_proj) 0.02 / sqrt(2 n_layer); biases 0; LayerNorms 1, 0.
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (auto& [name, p] : named_parameters()) {
    if (name.find(".ln_") != std::string::npos) continue;
    if (ends_with(name, ".bias")) {
      p.copy_(Tensor::zeros(p.shape(), p.dtype()));
    } else {
      const double std = ends_with(name, "c_proj.weight") ? residual_std : 0.02;
      p.copy_(normal(p.shape(), 0.0, std, generator(), p.dtype()));
    }
  }
}

Tensor GPT::forward(const Tensor& idx) {
  Tensor x = embed(idx);
  for (size_t i = 0; i < blocks_.size(); ++i) x = block(i, x);
  return head(x);
}

KVCache GPT::make_cache(int64_t batch, Device device) const {
  if (batch < 1) throw ShapeError(str_cat("[GPT] a cache needs a batch >= 1, got ", batch));
  const int64_t h = config_.n_head, d = config_.n_embd / h;
  const DType dtype = wte_->weight().dtype();
  KVCache cache;
  cache.batch = batch;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    cache.keys.push_back(Tensor::zeros({config_.block_size, batch * h, d}, dtype, device));
    cache.values.push_back(Tensor::zeros({config_.block_size, batch * h, d}, dtype, device));
  }
  return cache;
}

Tensor GPT::forward_cached(const Tensor& idx, int64_t start, KVCache& cache) {
  if (idx.dim() != 2 || idx.dtype() != DType::kInt32 || idx.size(0) != cache.batch ||
      cache.keys.size() != blocks_.size() || start < 0 || idx.size(1) < 1 ||
      start + idx.size(1) > config_.block_size) {
    throw ShapeError(str_cat("[GPT] forward_cached expects int32 tokens [", cache.batch,
                             ", T] at positions [start, start + T) within the context of ",
                             config_.block_size, ", got ", idx.describe(), " at start ", start,
                             " (a cache of ", cache.keys.size(), " blocks for a model of ",
                             blocks_.size(), ")"));
  }
  const NoGradGuard no_grad;
  const int64_t b = idx.size(0), t = idx.size(1);
  std::vector<int32_t> at(static_cast<size_t>(b * t));
  for (size_t i = 0; i < at.size(); ++i) at[i] = static_cast<int32_t>(start + int64_t(i) % t);
  Tensor x = add((*wte_)(idx), (*wpe_)(Tensor::from_vector<int32_t>({b, t}, at, idx.device())));
  for (size_t i = 0; i < blocks_.size(); ++i) {
    x = blocks_[i]->forward_cached(x, start, cache.keys[i], cache.values[i]);
  }
  return head(x);
}

Tensor GPT::embed(const Tensor& idx) {
  if (idx.dim() != 2 || idx.dtype() != DType::kInt32 || idx.size(1) > config_.block_size ||
      idx.size(1) < 1) {
    throw ShapeError(str_cat("[GPT] expects int32 token indices [B, T] with 1 <= T <= ",
                             config_.block_size, ", got ", idx.describe()));
  }
  return add((*wte_)(idx), (*wpe_)(positions(idx.size(0), idx.size(1), idx.device())));
}

const Tensor& GPT::positions(int64_t b, int64_t t, Device device) {
  // Made once per shape and device, and staged to a GPU through pinned memory: a copy per
  // forward would make the host wait for the device at every micro-step, and could not be
  // captured in a CUDA graph. The stager keeps the pinned sources as long as the model lives.
  Tensor& pos = positions_[{b, t, device.is_cpu() ? -1 : device.index}];
  if (!pos.defined()) {
    std::vector<int32_t> values(static_cast<size_t>(b * t));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i % t);
    const Tensor host = Tensor::from_vector<int32_t>({b, t}, values);
    if (device.is_cpu()) {
      pos = host;
    } else {
      if (!position_stager_ || position_stager_->device() != device) {
        position_stager_ = std::make_shared<HostToDevice>(device);
      }
      HostToDevice::Pending staged = position_stager_->stage(host);
      pos = position_stager_->ready(staged);
    }
  }
  return pos;
}

Tensor GPT::block(size_t i, const Tensor& x) {
  return (*blocks_.at(i))(x);
}

Tensor GPT::head(const Tensor& x) {
  const Tensor h = reshape((*ln_f_)(x), {x.size(0) * x.size(1), config_.n_embd});
  return linear(h, wte_->weight(), Tensor());  // the tied head: [B T, V]
}

}  // namespace accrue::nn
