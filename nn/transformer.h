// A GPT in nanoGPT's shape: token and position embeddings, pre-LayerNorm transformer blocks
// (causal self-attention and a GELU MLP, each around a residual), a final LayerNorm and an output
// projection tied to the token embedding. Parameter names, layouts and initialisation are
// nanoGPT's (transformer.wte.weight [V, C], transformer.h.{i}.attn.c_attn.weight [3C, C], ...;
// normal(0, 0.02), the residual projections' weights scaled by 1 / sqrt(2 n_layer), biases 0),
// so a state dict moves between the two. The tied matrix is one parameter, used twice: its
// gradient is the sum of both uses, accumulated into one view of the gradient arena. Decoding
// keeps each block's keys and values (KVCache, GPT::forward_cached), so a new token costs one
// position, not the whole prefix. Read next: examples/g2p/g2p.h.
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/staging.h"
#include "nn/linear.h"
#include "nn/norm.h"

namespace accrue::nn {

// An embedding table: index int32 [...] -> [..., dim], rows of weight [num, dim]. PyTorch's
// default initialisation, normal(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& index) override;
  Tensor weight() const { return weight_; }

 private:
  Tensor weight_;  // [num, dim]
};

struct GPTConfig {
  int64_t vocab_size = 0, block_size = 0;  // tokens; the longest sequence
  int64_t n_layer = 4, n_head = 4, n_embd = 128;
};

// The keys and values of every block for the first positions of B sequences, kept while decoding:
// keys[i], values[i] [block_size, B H, D] per block i, position-major, so the positions a step
// adds are one contiguous range. Made by GPT::make_cache; filled by GPT::forward_cached.
struct KVCache {
  std::vector<Tensor> keys, values;
  int64_t batch = 0;
};

// Multi-head causal self-attention of x [B, T, C]: q, k, v from one projection c_attn [3C, C],
// split into n_head heads of C / n_head; per head softmax(q k^T / sqrt(d)) v with the causal
// mask fused into the softmax; the heads merged and projected by c_proj [C, C].
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GPTConfig& config, DType dtype);
  Tensor forward(const Tensor& x) override;
  // x [B, T, C] at positions [start, start + T): their keys and values go into keys and values
  // [block_size, B H, D] at those positions, and the queries attend to every position up to
  // their own, the first `start` read from the cache. Not recorded.
  Tensor forward_cached(const Tensor& x, int64_t start, Tensor& keys, Tensor& values);

 private:
  // [B, T, C] -> q, k, v [3, B H, T, D], heads split
  Tensor heads(const Tensor& qkv, int64_t b, int64_t t) const;
  // y [B H, T, D] -> the heads merged and projected, [B, T, C]
  Tensor merge(const Tensor& y, int64_t b, int64_t t);

  int64_t n_head_, n_embd_;
  std::shared_ptr<Linear> c_attn_, c_proj_;
};

// x [B, T, C] -> x + attn(ln_1(x)), then + mlp(ln_2(x)); mlp = c_proj(gelu(c_fc(.))), 4C wide.
class Block : public Module {
 public:
  Block(const GPTConfig& config, DType dtype);
  Tensor forward(const Tensor& x) override;
  // The same, its attention reading and filling a cache (CausalSelfAttention::forward_cached).
  Tensor forward_cached(const Tensor& x, int64_t start, Tensor& keys, Tensor& values);

 private:
  Tensor mlp_residual(const Tensor& a);  // a + mlp(ln_2(a))
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Linear> c_fc_, c_proj_;
};

// idx int32 [B, T] (T <= block_size) -> logits [B * T, vocab_size], row b * T + t predicting the
// token after idx[b, t].
class GPT : public Module {
 public:
  GPT(const GPTConfig& config, DType dtype = DType::kFloat32);
  Tensor forward(const Tensor& idx) override;
  const GPTConfig& config() const { return config_; }
  // Decoding. make_cache: an empty cache for `batch` sequences on `device`, in the dtype the
  // model computes with. forward_cached: idx int32 [B, T] holds the tokens at positions
  // [start, start + T) of the cache's B sequences, whose positions [0, start) the cache holds
  // already; returns their logits [B T, V], as forward() of the whole prefix gives them (up to
  // rounding: the products have other shapes), and the cache now holds [0, start + T). A step
  // may start before the cache's end: those positions are computed again (a row whose token
  // there changed). Not recorded.
  KVCache make_cache(int64_t batch, Device device) const;
  Tensor forward_cached(const Tensor& idx, int64_t start, KVCache& cache);
  // forward() in its three parts, which pipeline stages run apart: idx [B, T] -> the embeddings
  // x [B, T, C]; block i; the final LayerNorm and the tied head, x [B, T, C] -> [B T, V].
  Tensor embed(const Tensor& idx);
  Tensor block(size_t i, const Tensor& x);
  Tensor head(const Tensor& x);
  Embedding& wte() { return *wte_; }
  Embedding& wpe() { return *wpe_; }
  LayerNorm& ln_f() { return *ln_f_; }
  size_t n_blocks() const { return blocks_.size(); }
  Module& block_module(size_t i) { return *blocks_.at(i); }

 private:
  GPTConfig config_;
  std::shared_ptr<Embedding> wte_, wpe_;
  // int32 [B, T]: each row 0, 1, ..., T - 1, by (B, T, device: -1 for the CPU).
  const Tensor& positions(int64_t b, int64_t t, Device device);
  std::map<std::tuple<int64_t, int64_t, int>, Tensor> positions_;
  std::shared_ptr<HostToDevice> position_stager_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
};

}  // namespace accrue::nn
