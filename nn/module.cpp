// Parameter registration and the recursive name walk of Module.
#include "nn/module.h"

#include "core/error.h"
#include "kernels/profile.h"
#include "ops/autograd.h"

namespace accrue::nn {

Tensor Module::operator()(const Tensor& x) {
  const ProfileScope scope(profile_scope());
  const ModuleScope module(path_);
  const size_t mark = tape_size();
  try {
    return forward(x);
  } catch (...) {
    truncate_tape(mark);
    if (path_ != nullptr) rethrow_naming_module(path_, "forward");
    throw;
  }
}

// A name names one parameter, buffer or child of a module: the saved weights and checkpoints
// key their tensors by the dotted names.
void Module::check_new_name(const std::string& name) const {
  const auto taken = [&](const auto& list) {
    for (const auto& entry : list) {
      if (entry.first == name) return true;
    }
    return false;
  };
  if (taken(params_) || taken(buffers_) || taken(children_)) {
    throw ValueError(str_cat("[Module] the name '", name, "' is registered twice"));
  }
}

void Module::adopt(const std::string& name, std::shared_ptr<Module> child) {
  check_new_name(name);
  child->set_path(name);
  children_.emplace_back(name, std::move(child));
}

// This module's dotted path, and its children's below it (they may have registered first).
void Module::set_path(const std::string& path) {
  scope_ = "forward " + path;
  path_ = intern_module_path(path);
  for (auto& [name, child] : children_) child->set_path(path + "." + name);
}

Tensor& Module::register_parameter(const std::string& name, Tensor value) {
  check_new_name(name);
  value.set_requires_grad(true);
  params_.emplace_back(name, std::move(value));
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  buffers_.emplace_back(name, std::move(value));
  return buffers_.back().second;
}

std::vector<NamedTensor> Module::named_buffers() const {
  std::vector<NamedTensor> out = buffers_;
  for (const auto& [prefix, child] : children_) {
    for (auto& [name, t] : child->named_buffers()) out.emplace_back(prefix + "." + name, t);
  }
  return out;
}

std::vector<NamedTensor> Module::named_state() const {
  std::vector<NamedTensor> out = named_parameters();
  for (auto& b : named_buffers()) out.push_back(b);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

std::vector<NamedTensor> Module::named_parameters() const {
  std::vector<NamedTensor> out = params_;
  for (const auto& [prefix, child] : children_) {
    for (auto& [name, t] : child->named_parameters()) out.emplace_back(prefix + "." + name, t);
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

Tensor Module::parameter(const std::string& name) const {
  std::string known;
  for (auto& [n, t] : named_parameters()) {
    if (n == name) return t;
    known += (known.empty() ? "" : ", ") + n;
  }
  throw ValueError(str_cat("[parameter] no parameter named '", name, "'; the model has: ", known));
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::to(Device device) {
  for (auto& [name, t] : named_state()) {
    if (t.device() != device) t.set_data(t.to(device));
  }
}

}  // namespace accrue::nn
