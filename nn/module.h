// Module: the base of every layer. A module registers its parameters, buffers and child modules
// under PyTorch's names ("layers.0.weight", "norm1.running_mean"), so checkpoints move between
// accrue and PyTorch. Parameters are trained; buffers (BatchNorm's running statistics) are state
// that is saved and loaded but never given to an optimizer. train() / eval() set the mode of the
// module and its children (BatchNorm and Dropout behave differently). Under ACCRUE_PROFILE a
// registered module's forward is a profile scope named by its path ("forward conv1"). A module
// does not own gradient memory: optim::ParameterArena gathers the parameters of a model into one
// contiguous buffer and gives each a view of a parallel gradient arena. Read next: linear.h.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace accrue::nn {

using NamedTensor = std::pair<std::string, Tensor>;

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  // forward(x); if it throws, the nodes it had recorded are dropped from the tape, and an op's
  // error names the module's path: "[reshape] ... (in module transformer.h.0.attn's forward)".
  Tensor operator()(const Tensor& x);

  // Every parameter of this module and its children, depth first in registration order.
  std::vector<NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // The parameter with this dotted name; throws ValueError listing the known names otherwise.
  Tensor parameter(const std::string& name) const;
  int64_t num_parameters() const;
  // Every buffer of this module and its children, depth first; and parameters then buffers.
  std::vector<NamedTensor> named_buffers() const;
  std::vector<NamedTensor> named_state() const;
  // Moves every parameter and buffer to a device (before building an arena).
  void to(Device device);

  // Training mode (the default) or evaluation mode, for this module and its children.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // The profiler's scope name for this module's forward ("forward layers.0"); null for a root.
  const char* profile_scope() const { return scope_.empty() ? nullptr : scope_.c_str(); }

 protected:
  Tensor& register_parameter(const std::string& name, Tensor value);
  Tensor& register_buffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    adopt(name, module);
    return module;
  }

 private:
  void check_new_name(const std::string& name) const;
  void adopt(const std::string& name, std::shared_ptr<Module> child);
  void set_path(const std::string& path);

  std::vector<NamedTensor> params_, buffers_;
  bool training_ = true;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  // "forward conv1", "forward layers.0": the profiler's scope for the calls this module's forward
  // makes itself (the dotted path from the outermost registering module; empty for a root).
  std::string scope_;
  const char* path_ = nullptr;  // "layers.0" (interned, ops/autograd.h); null for a root
};

}  // namespace accrue::nn
