// Sequential: runs its children in order. Children are named "0", "1", ... as in PyTorch, so a
// Sequential's first Linear has parameters "0.weight" and "0.bias".
#pragma once

#include <memory>
#include <vector>

#include "nn/module.h"

namespace accrue::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  // Appends a module under the next index; returns it for chaining.
  template <typename M>
  std::shared_ptr<M> add(std::shared_ptr<M> module) {
    layers_.push_back(module);
    return register_module(std::to_string(layers_.size() - 1), std::move(module));
  }
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const { return layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace accrue::nn
