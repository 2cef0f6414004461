// Building the arenas: lay out offsets, copy values in, rebind parameters and their grads.
#include "optim/arena.h"

#include <mutex>
#include <unordered_set>

#include "core/error.h"
#include "kernels/factories.h"

namespace accrue::optim {

namespace {

// The parameters gathered by a live arena, process-wide: a parameter joins one arena at most.
struct Members {
  std::mutex mutex;
  std::unordered_set<const TensorImpl*> impls;
};
Members& members() {
  static Members m;
  return m;
}
bool in_an_arena(const Tensor& p) {
  std::lock_guard<std::mutex> lock(members().mutex);
  return members().impls.count(p.impl().get()) > 0;
}

}  // namespace

ParameterArena::ParameterArena(const std::vector<nn::NamedTensor>& params, int64_t shards) {
  if (params.empty()) throw ValueError("[ParameterArena] the model has no parameters");
  if (shards < 1 || shards > (int64_t{1} << 24)) {
    throw ValueError(str_cat("[ParameterArena] shards = ", shards, "; give 1 or more"));
  }
  const Tensor& first = params.front().second;
  int64_t total = 0;
  std::vector<int64_t> offsets;
  for (const auto& [name, p] : params) {
    // A second arena would move the parameter away from the first one, whose optimizer would
    // then update memory nobody reads.
    if (in_an_arena(p)) {
      throw ValueError(str_cat("[ParameterArena] parameter '", name,
                               "' already belongs to another ParameterArena; build one arena per "
                               "model and share it between optimizers"));
    }
    if (p.dtype() != first.dtype() || p.device() != first.device() || !is_floating(p.dtype())) {
      throw DTypeError(str_cat("[ParameterArena] parameter '", name, "' is ", p.describe(),
                               " but '", params.front().first, "' is ", first.describe(),
                               "; all parameters must share one floating dtype and device"));
    }
    offsets.push_back(total);
    total += (p.numel() + kAlign - 1) / kAlign * kAlign;
  }
  const int64_t quantum = kAlign * shards;
  total = (total + quantum - 1) / quantum * quantum;
  params_ = Tensor::zeros({total}, first.dtype(), first.device());
  grads_ = Tensor::zeros({total}, first.dtype(), first.device());
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i].second;  // a handle: set_data below moves every handle
    const int64_t n = p.numel();
    Tensor value = params_.narrow(offsets[i], n).view(p.shape());
    value.copy_(p);
    p.set_data(value);
    p.set_grad(grads_.narrow(offsets[i], n).view(p.shape()));
    {
      std::lock_guard<std::mutex> lock(members().mutex);
      members().impls.insert(p.impl().get());
    }
    entries_.push_back({params[i].first, p, value, offsets[i]});
  }
}

void ParameterArena::use_working_copy(DType dtype) {
  if (!is_half(dtype)) {
    throw DTypeError(
        str_cat("[ParameterArena] a working copy is bfloat16 or float16, got ", dtype_name(dtype)));
  }
  if (offloaded_) throw ValueError("[ParameterArena] use_working_copy() after offload_masters()");
  if (working_.defined()) throw ValueError("[ParameterArena] the arena has a working copy already");
  if (params_.dtype() != DType::kFloat32) {
    throw DTypeError(str_cat("[ParameterArena] a 16-bit working copy needs float32 master values, ",
                             "the parameters are ", dtype_name(params_.dtype())));
  }
  working_ = to_dtype(params_, dtype);  // the padding stays zero
  for (Entry& e : entries_) {
    // Every handle of the parameter now sees its slot of the working copy; its grad stays the
    // float32 view of the gradient arena.
    const Tensor w = working_.narrow(e.offset, e.param.numel());
    TensorImpl& impl = *e.param.impl();
    impl.storage = w.impl()->storage;
    impl.offset = w.impl()->offset;
    impl.dtype = dtype;
  }
}

void ParameterArena::offload_masters() {
  offload_masters(0, size());
}

void ParameterArena::offload_masters(int64_t begin, int64_t end) {
  if (offloaded_) throw ValueError("[ParameterArena] the masters are offloaded already");
  if (begin < 0 || end <= begin || end > size()) {
    throw ValueError(str_cat("[ParameterArena] cannot offload elements [", begin, ", ", end,
                             ") of an arena of ", size()));
  }
  const int64_t n = end - begin;
  Tensor host = Tensor::zeros_pinned({n}, dtype());
  host.copy_(params_.narrow(begin, n));
  // Without a 16-bit copy the model's handles keep the device buffer, which becomes the
  // working copy; with one, the device masters are dropped.
  if (!working_.defined()) working_ = params_;
  params_ = host;
  masters_begin_ = begin;
  for (Entry& e : entries_) {
    e.master = masters_whole() ? params_.narrow(e.offset, e.param.numel()).view(e.param.shape())
                               : Tensor();  // on the ranks that hold it
  }
  host_grads_ = Tensor::zeros_pinned({n}, dtype());
  if (working_.dtype() != dtype()) host_working_ = Tensor::zeros_pinned({n}, working_.dtype());
  offloaded_ = true;
}

Tensor ParameterArena::state_zeros(const Shape& shape, DType dtype) const {
  return offloaded_ ? Tensor::zeros_pinned(shape, dtype) : Tensor::zeros(shape, dtype, device());
}

std::vector<nn::NamedTensor> ParameterArena::named_masters() const {
  if (!masters_whole()) {
    throw ValueError(str_cat("[ParameterArena] this process holds elements [", masters_begin_, ", ",
                             masters_begin_ + params_.numel(), ") of the ", size(),
                             " masters; the others are on other ranks"));
  }
  std::vector<nn::NamedTensor> out;
  for (const Entry& e : entries_) out.emplace_back(e.name, e.master);
  return out;
}

std::vector<nn::NamedTensor> ParameterArena::named_views(const Tensor& whole) const {
  if (whole.shape() != Shape{size()}) {
    throw ShapeError(
        str_cat("[ParameterArena] named_views of ", whole.describe(), ", not [", size(), "]"));
  }
  std::vector<nn::NamedTensor> out;
  for (const Entry& e : entries_) {
    out.emplace_back(e.name, whole.narrow(e.offset, e.param.numel()).view(e.param.shape()));
  }
  return out;
}

ParameterArena::~ParameterArena() {
  std::lock_guard<std::mutex> lock(members().mutex);
  for (Entry& e : entries_) members().impls.erase(e.param.impl().get());
}

void ParameterArena::zero_grad() {
  if (grads_held()) grads_.zero_();
}

void ParameterArena::release_grads() {
  grads_.impl()->storage->release();
}

void ParameterArena::acquire_grads() {
  grads_.impl()->storage->reacquire_zeroed(grads_);
}

bool ParameterArena::grads_held() const {
  return grads_.impl()->storage->held();
}

}  // namespace accrue::optim
