// The parameter and gradient arenas. All parameters of a model are moved into one contiguous
// buffer; their gradients live in a parallel buffer with the same offsets, and each parameter's
// `grad` is a view of it. Backward accumulates into those views in place, so the optimizer step
// and the global norm are single flat passes, and zeroing every gradient is one memset.
// Read next: optimizer.h.
#pragma once

#include <string>
#include <vector>

#include "nn/module.h"

namespace accrue::optim {

class ParameterArena {
 public:
  struct Entry {
    std::string name;
    Tensor param;    // a view of params()
    int64_t offset;  // in elements, a multiple of kAlign
  };
  // Each parameter starts at a multiple of kAlign elements (64 bytes for float32), so kernels
  // may use vector loads; the gaps hold zeros in both arenas.
  static constexpr int64_t kAlign = 16;

  // Gathers the parameters (all of one floating dtype and one device): their values are copied
  // into the arena and every handle to them now sees the arena's memory.
  // shards: the arena's size is padded (with zeros) to a multiple of kAlign x shards, so a
  // sharded optimizer (Optimizer::shard) splits it into equal, aligned slices.
  explicit ParameterArena(const std::vector<nn::NamedTensor>& params, int64_t shards = 1);
  explicit ParameterArena(const nn::Module& module, int64_t shards = 1)
      : ParameterArena(module.named_parameters(), shards) {}
  // Releases the parameters, which may then join another arena (they keep the arena's memory).
  ~ParameterArena();
  ParameterArena(const ParameterArena&) = delete;
  ParameterArena& operator=(const ParameterArena&) = delete;

  Tensor& params() { return params_; }  // [size()]
  Tensor& grads() { return grads_; }    // [size()]
  const std::vector<Entry>& entries() const { return entries_; }
  int64_t size() const { return params_.numel(); }
  DType dtype() const { return params_.dtype(); }
  Device device() const { return params_.device(); }
  // One memset over the gradient arena.
  void zero_grad() { grads_.zero_(); }

 private:
  Tensor params_, grads_;
  std::vector<Entry> entries_;
};

}  // namespace accrue::optim
