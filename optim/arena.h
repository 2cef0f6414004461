// The parameter and gradient arenas. All parameters of a model are moved into one contiguous
// buffer; their gradients live in a parallel buffer with the same offsets, and each parameter's
// `grad` is a view of it. Backward accumulates into those views in place, so the optimizer step
// and the global norm are single flat passes, and zeroing every gradient is one memset.
//
// Mixed precision (use_working_copy): the arena keeps the float32 master values, and a third
// buffer with the same offsets holds their 16-bit working copy. The model's parameter handles
// then see the working copy (forward and backward run in 16 bits) while their `grad` stays a
// float32 view of the gradient arena, so the weight-gradient GEMMs accumulate in float32. The
// optimizer's fused pass updates the master and rewrites the working copy in the same loop.
//
// Offloaded masters (offload_masters, for the offloaded optimizer of offload.h): the master
// values, and host copies of the gradient and the working copy, live in pinned host memory and the
// compute device keeps only what forward and backward touch: the gradient arena and the working
// copy, which is then the 16-bit copy or, without mixed precision, a device copy of the masters in
// their own dtype. device() stays the compute device. Under ZeRO-1 and 2 a rank offloads only its
// slice (offload_masters(begin, end)): its host holds those elements of the masters and of the
// host copies, and the rest of the masters lives on the other ranks. Read next: seams.h.
#pragma once

#include <string>
#include <vector>

#include "nn/module.h"

namespace accrue::optim {

class ParameterArena {
 public:
  struct Entry {
    std::string name;
    Tensor param;    // the model's handle: a view of masters(), or of working() when there is one
    Tensor master;   // its float master value: a view of masters() (the same as param without a
                     // working copy)
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

  // Gives the model a 16-bit working copy (DType::kBFloat16 or kFloat16) of the float32 master
  // values: see the top of this file. Once, before an optimizer is built on the arena.
  void use_working_copy(DType dtype);
  // Moves the master values to pinned host memory (see the top of this file). Once, after
  // use_working_copy when there is one, before an optimizer is built on the arena. With a range,
  // only elements [begin, end) of the masters, and of the host copies of the gradient and the
  // 16-bit copy, are kept (a ZeRO rank's slice): masters() is then [end - begin], starting at
  // element masters_begin(), and named_masters() throws (the strategy gathers the slices).
  void offload_masters();
  void offload_masters(int64_t begin, int64_t end);
  bool offloaded() const { return offloaded_; }
  int64_t masters_begin() const { return masters_begin_; }
  bool masters_whole() const { return params_.numel() == size(); }

  // Where the optimizer works: beside the masters. The gradient it reads and the 16-bit copy it
  // writes are grads() and working() themselves or, when offloaded, their counterparts in pinned
  // host memory (master_working() is then undefined without a 16-bit copy: the device copy has
  // the masters' own dtype and is sent the masters).
  Tensor& master_grads() { return offloaded_ ? host_grads_ : grads_; }
  Tensor& master_working() { return offloaded_ ? host_working_ : working_; }
  Device masters_device() const { return params_.device(); }
  // Zeros for optimizer state, beside the masters (pinned host memory when offloaded).
  Tensor state_zeros(const Shape& shape, DType dtype) const;

  // [size()] the master values (on the host if offloaded; a slice if offloaded to a range)
  Tensor& masters() { return params_; }
  const Tensor& masters() const { return params_; }
  Tensor& grads() { return grads_; }  // [size()]
  const Tensor& grads() const { return grads_; }
  // [size()] what the model computes with when it is not masters(): the 16-bit copy, or the
  // device copy of offloaded masters; undefined otherwise.
  Tensor& working() { return working_; }
  const Tensor& working() const { return working_; }
  // The master values under the parameters' names: what is saved and hashed. Throws when this
  // process holds a slice of them (masters_whole() is false).
  std::vector<nn::NamedTensor> named_masters() const;
  // The parameters' views of `whole`, any [size()] tensor laid out as the arena is.
  std::vector<nn::NamedTensor> named_views(const Tensor& whole) const;
  const std::vector<Entry>& entries() const { return entries_; }
  int64_t size() const { return grads_.numel(); }
  DType dtype() const { return params_.dtype(); }    // of the masters and the gradients
  Device device() const { return grads_.device(); }  // where forward and backward run
  // One memset over the gradient arena (none while it is released).
  void zero_grad();
  // ZeRO-2 with a reduce-scatter at every micro-step keeps the whole gradient only during a
  // window: release_grads() hands its memory back (every parameter's `grad` view stays, unread
  // until acquire_grads(), which takes the memory again, zeroed).
  void release_grads();
  void acquire_grads();
  bool grads_held() const;

 private:
  Tensor params_, grads_, working_;
  Tensor host_grads_, host_working_;  // offloaded: the gradient's and working copy's host copies
  std::vector<Entry> entries_;
  bool offloaded_ = false;
  int64_t masters_begin_ = 0;
};

}  // namespace accrue::optim
