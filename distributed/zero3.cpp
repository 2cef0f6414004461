// ZeRO stage 3 (see zero3.h).
#include "distributed/zero3.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/factories.h"
#include "ops/autograd.h"

namespace accrue::distributed {

namespace {

constexpr int64_t kAlign = optim::ParameterArena::kAlign;

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// The identity at a layer's output whose backward gathers the layer before it runs.
struct GatherBeforeBackward final : Node {
  ShardedLayers* layers = nullptr;
  int layer = 0;
  const char* name() const override { return "zero3_gather"; }
  void backward(const Tensor& grad_out, GradSink& sink) override {
    layers->before_backward(layer);
    sink.add(0, grad_out);
  }
};

}  // namespace

// A unit's layout: its parameters at aligned offsets in a flat buffer of `size` elements
// (padded to N equal slices of `slice`), the gathered values and the gradient buffer ([size]
// each, their storage released between uses).
struct ShardedLayers::Placed {
  std::string name;
  std::vector<Tensor> params;
  std::vector<int64_t> offsets;
  int64_t size = 0, slice = 0;
  int64_t arena_offset = -1;
  Tensor values, grads;
  Tensor initial;  // [size] the master values before bind(), for shards()
  Storage& values_storage() const { return *values.impl()->storage; }
  Storage& grads_storage() const { return *grads.impl()->storage; }
};

ShardedLayers::ShardedLayers(std::vector<Unit> units, std::vector<std::vector<int>> uses,
                             const std::vector<nn::NamedTensor>& model_parameters,
                             Communicator& comm, DType master, DType compute, Device device,
                             ZeroPrefetch prefetch)
    : comm_(comm),
      master_(master),
      compute_(compute),
      device_(device),
      prefetch_(prefetch),
      uses_(std::move(uses)) {
  if (uses_.size() != units.size()) {
    throw ValueError(str_cat("[zero3] ", units.size(), " units and ", uses_.size(), " layers"));
  }
  std::unordered_map<const TensorImpl*, int> owners;
  for (const Unit& u : units) {
    for (const Tensor& p : u.params) ++owners[p.impl().get()];
  }
  for (const auto& [name, p] : model_parameters) {
    order_.emplace_back(name, p.impl().get());
    const auto it = owners.find(p.impl().get());
    const int n = it == owners.end() ? 0 : it->second;
    if (n != 1) {
      throw ValueError(str_cat("[zero3] parameter ", name, " belongs to ", n,
                               " of the model's layers (Task::layers), not one"));
    }
  }
  const int64_t world = comm.world_size();
  for (Unit& u : units) {
    auto placed = std::make_unique<Placed>();
    placed->name = u.name;
    int64_t n = 0;
    for (const Tensor& p : u.params) {
      placed->offsets.push_back(n);
      n = round_up(n + p.numel(), kAlign);
    }
    placed->size = n == 0 ? 0 : round_up(n, kAlign * world);
    placed->slice = placed->size / world;
    placed->params = std::move(u.params);
    if (placed->size > 0) {
      placed->initial = Tensor::zeros({placed->size}, master, device);
      for (size_t i = 0; i < placed->params.size(); ++i) {
        const Tensor& p = placed->params[i];
        placed->initial.narrow(placed->offsets[i], p.numel())
            .copy_(to_dtype(p, master).to(device).view({p.numel()}));
      }
      placed->values = Tensor::empty({placed->size}, compute, device);
      placed->grads = Tensor::empty({placed->size}, master, device);
      placed->grads_storage().release();
    }
    units_.push_back(std::move(placed));
  }
  started_.resize(units_.size());
  last_use_.assign(units_.size(), -1);
  for (int i = static_cast<int>(uses_.size()) - 1; i >= 0; --i) {
    for (int u : uses_[static_cast<size_t>(i)]) {
      if (u < 0 || u >= static_cast<int>(units_.size())) {
        throw ValueError(str_cat("[zero3] layer ", i, " uses unit ", u, " of ", units_.size()));
      }
      last_use_[static_cast<size_t>(u)] = i;
    }
  }
}

ShardedLayers::~ShardedLayers() = default;

std::vector<nn::NamedTensor> ShardedLayers::shards() const {
  std::vector<nn::NamedTensor> out;
  for (const auto& u : units_) {
    if (u->size == 0) continue;
    out.emplace_back("zero3/" + u->name,
                     u->initial.narrow(comm_.rank() * u->slice, u->slice).clone());
  }
  return out;
}

void ShardedLayers::bind(optim::ParameterArena& arena) {
  arena_ = &arena;
  for (auto& u : units_) {
    if (u->size == 0) continue;
    for (const auto& e : arena.entries()) {
      if (e.name == "zero3/" + u->name) u->arena_offset = e.offset;
    }
    if (u->arena_offset < 0) throw std::logic_error("[zero3] the arena lacks unit " + u->name);
    u->values.copy_(to_dtype(u->initial, compute_));
    u->initial = Tensor();
    for (size_t i = 0; i < u->params.size(); ++i) {
      TensorImpl& impl = *u->params[i].impl();
      const int64_t n = shape_numel(impl.shape);
      impl.storage = u->values.impl()->storage;
      impl.offset = u->offsets[i];
      impl.dtype = compute_;
      impl.grad = u->grads.narrow(u->offsets[i], n).view(impl.shape).impl();
    }
  }
}

void ShardedLayers::gather(int unit) {
  if (std::unique_ptr<Transfer>& started = started_[static_cast<size_t>(unit)]) {
    started->wait();
    started.reset();
    return;
  }
  const Placed& u = *units_[static_cast<size_t>(unit)];
  if (u.size > 0 && !u.values_storage().held()) gather_into_buffer(unit, false);
}

void ShardedLayers::start_gather(int unit) {
  const Placed& u = *units_[static_cast<size_t>(unit)];
  if (u.size > 0 && !u.values_storage().held()) gather_into_buffer(unit, true);
}

// The buffer is held from here (a started gather counts as held); a gather that fails to start
// leaves it released, so a later gather does not skip it.
void ShardedLayers::gather_into_buffer(int unit, bool ahead) {
  Placed& u = *units_[static_cast<size_t>(unit)];
  u.values_storage().reacquire();
  const Tensor& source = arena_->working().defined() ? arena_->working() : arena_->masters();
  const Tensor mine = source.narrow(u.arena_offset, u.slice);
  try {
    if (ahead) {
      started_[static_cast<size_t>(unit)] = comm_.start_all_gather(mine, u.values);
    } else {
      comm_.all_gather(mine, u.values);
    }
  } catch (...) {
    u.values_storage().release();
    throw;
  }
}

void ShardedLayers::start_gathers(int layer) {
  if (layer < 0 || layer >= layers()) return;
  for (int u : uses_[static_cast<size_t>(layer)]) start_gather(u);
}

// A gather still on its way completes first: its buffer must not be handed out meanwhile.
void ShardedLayers::release(int unit) {
  if (started_[static_cast<size_t>(unit)]) gather(unit);
  Placed& u = *units_[static_cast<size_t>(unit)];
  if (u.size > 0) u.values_storage().release();
}

// The unit's gradient summed over the ranks, this rank's slice added to the arena's.
void ShardedLayers::reduce_scatter(int unit) {
  Placed& u = *units_[static_cast<size_t>(unit)];
  if (u.size == 0) return;
  u.grads_storage().reacquire_zeroed(u.grads);  // no backward reached it: the collective still runs
  Tensor own = u.grads.narrow(comm_.rank() * u.slice, u.slice);
  comm_.reduce_scatter(u.grads, own);
  Tensor shard = arena_->grads().narrow(u.arena_offset, u.slice);
  backend_for(device_).axpy(1.0, own, shard);
  u.grads_storage().release();
}

void ShardedLayers::begin_window() {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->size == 0) continue;
    release(static_cast<int>(u));
    units_[u]->grads_storage().release();  // a window abandoned halfway left partial sums
  }
}

void ShardedLayers::before_forward(int layer) {
  if (layer == 0) backward_reached_ = layers();
  for (int u : uses_[static_cast<size_t>(layer)]) gather(u);
  if (prefetch_ != ZeroPrefetch::kNone) start_gathers(layer + 1);
}

void ShardedLayers::after_forward(int layer) {
  for (int u : uses_[static_cast<size_t>(layer)]) {
    const bool next_uses =
        layer + 1 < layers() && std::count(uses_[static_cast<size_t>(layer + 1)].begin(),
                                           uses_[static_cast<size_t>(layer + 1)].end(), u) > 0;
    if (!next_uses) release(u);
  }
}

Tensor ShardedLayers::mark(const Tensor& output, int layer) {
  if (!should_record({&output})) return output;
  Tensor out = output.view(output.shape());
  auto node = std::make_unique<GatherBeforeBackward>();
  node->layers = this;
  node->layer = layer;
  record(std::move(node), {&output}, out);
  return out;
}

void ShardedLayers::before_backward(int layer) {
  backward_reached_ = std::min(backward_reached_, layer);
  const std::vector<int>& mine = uses_[static_cast<size_t>(layer)];
  if (layer + 1 < layers()) {
    // Layer i + 1's backward is done: its units leave, reduce-scattered where it was their last.
    for (int u : uses_[static_cast<size_t>(layer + 1)]) {
      if (std::count(mine.begin(), mine.end(), u) > 0) continue;
      if (last_use_[static_cast<size_t>(u)] == layer + 1) reduce_scatter(u);
      release(u);
    }
  }
  for (int u : mine) {
    gather(u);
    Placed& p = *units_[static_cast<size_t>(u)];
    if (p.size > 0) p.grads_storage().reacquire_zeroed(p.grads);
  }
  if (prefetch_ == ZeroPrefetch::kForwardAndBackward) start_gathers(layer - 1);
}

void ShardedLayers::after_backward() {
  // The layers below the lowest mark the backward reached (their outputs needed no gradient).
  for (int i = backward_reached_ - 1; i >= 0; --i) before_backward(i);
  for (size_t u = 0; u < units_.size(); ++u) {
    if (last_use_[u] == 0) reduce_scatter(static_cast<int>(u));
  }
  begin_window();  // every unit released
}

void ShardedLayers::phantom_micro_step() {
  for (int i = 0; i < layers(); ++i) {
    before_forward(i);
    after_forward(i);
  }
  for (int i = layers() - 1; i >= 0; --i) before_backward(i);
  after_backward();
}

void ShardedLayers::gather_all() {
  for (size_t u = 0; u < units_.size(); ++u) gather(static_cast<int>(u));
}

std::vector<nn::NamedTensor> ShardedLayers::whole_masters() {
  std::unordered_map<const TensorImpl*, Tensor> whole;  // parameter -> its master values
  for (const auto& u : units_) {
    if (u->size == 0) continue;
    Tensor full = Tensor::empty({u->size}, master_, arena_->masters().device());
    comm_.all_gather(arena_->masters().narrow(u->arena_offset, u->slice), full);
    for (size_t i = 0; i < u->params.size(); ++i) {
      const Tensor& p = u->params[i];
      whole.emplace(p.impl().get(), full.narrow(u->offsets[i], p.numel()).view(p.shape()));
    }
  }
  std::vector<nn::NamedTensor> out;
  for (const auto& [name, impl] : order_) out.emplace_back(name, whole.at(impl).clone());
  return out;
}

size_t ShardedLayers::held_parameter_bytes() const {
  size_t n = 0;
  for (const auto& u : units_) {
    if (u->size > 0 && u->values_storage().held()) n += u->values.nbytes();
  }
  return n;
}

size_t ShardedLayers::held_gradient_bytes() const {
  size_t n = 0;
  for (const auto& u : units_) {
    if (u->size > 0 && u->grads_storage().held()) n += u->grads.nbytes();
  }
  return n;
}

}  // namespace accrue::distributed
