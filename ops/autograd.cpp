// The tape, the grad mode flag and the backward walk. See autograd.h for the contract.
#include "ops/autograd.h"

#include <atomic>
#include <mutex>
#include <set>
#include <unordered_map>

#include "kernels/backend.h"
#include "kernels/factories.h"
#include "kernels/profile.h"

namespace accrue {

struct TapeAccess {
  static std::vector<std::unique_ptr<Node>>& nodes(Tape& tape) { return tape.nodes_; }
  static const std::vector<std::unique_ptr<Node>>& nodes(const Tape& tape) { return tape.nodes_; }
};

namespace {
thread_local LeafReadyHook* leaf_ready_hook = nullptr;
thread_local const char* current_module = nullptr;  // ModuleScope

constexpr const char* kInModule = " (in module ";
template <typename E>
[[noreturn]] void append_where(const E& e, const std::string& where) {
  const std::string what = e.what();
  if (what.find(kInModule) != std::string::npos) throw;  // an inner module named itself
  throw E(what + where);
}
}  // namespace

namespace {

// Node ids are unique across threads and tapes, so a tensor names its node unambiguously: a
// tensor from a consumed or truncated tape, or from another thread's tape, is recognised by its
// slot no longer holding the node with its id.
std::atomic<uint64_t> g_next_node_id{1};

// Whether t was produced by a node that is still on tape t.
bool on_tape(const Tape& tape, const TensorImpl& t) {
  const auto slot = static_cast<size_t>(t.tape_slot);
  const auto& nodes = TapeAccess::nodes(tape);
  return slot < nodes.size() && nodes[slot] && nodes[slot]->id == t.node_id;
}

const char* kGoneTape =
    "was produced on a tape that is gone or not active: backward() already consumed it, "
    "clear_tape() or a failed forward dropped it, another thread recorded it (backward runs on "
    "the thread of its forward), or it was recorded under another TapeScope; recompute it in "
    "this micro-step";

thread_local Tape* g_scoped_tape = nullptr;  // the innermost TapeScope's

Tape& tape() {
  return active_tape();
}

thread_local bool g_grad_enabled = true;

// A gradient tensor nobody else holds can be accumulated into in place.
bool exclusively_owned(const Tensor& t) {
  return t.impl().use_count() == 1 && t.impl()->storage.use_count() == 1;
}

// leaf.grad += g, creating the persistent buffer as a copy of g on first use.
void accumulate_into_leaf(TensorImpl& leaf, const Tensor& g) {
  if (!leaf.grad) {
    leaf.grad = g.clone().impl();
    return;
  }
  Tensor grad(leaf.grad);
  backend_for(grad.device()).axpy(1.0, g, grad);
}

}  // namespace

const Tensor& Node::save(const Tensor& t) {
  saved_.push_back({t, t.defined() ? t.impl()->storage->version() : 0});
  return t;
}

void Node::check_saved() const {
  for (const Saved& s : saved_) {
    if (!s.tensor.defined()) continue;
    const uint64_t now = s.tensor.impl()->storage->version();
    if (now != s.version) {
      throw AutogradError(
          str_cat("[", name(), " backward] ", s.tensor.describe(),
                  " saved by the forward was modified in place afterwards (version ", s.version,
                  " -> ", now,
                  "); its gradient would be wrong. Modify a copy (clone()), or "
                  "run the update after backward()"));
    }
  }
}

TapeScope::TapeScope(Tape& tape) : tape_(tape), previous_(g_scoped_tape) {
  if (tape.active_) {
    throw AutogradError("[TapeScope] this tape is already active in another scope");
  }
  tape_.active_ = true;
  g_scoped_tape = &tape_;
}

TapeScope::~TapeScope() {
  tape_.active_ = false;
  g_scoped_tape = previous_;
}

Tape& active_tape() {
  if (g_scoped_tape != nullptr) return *g_scoped_tape;
  thread_local Tape own;
  return own;
}

bool grad_enabled() {
  return g_grad_enabled;
}
NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) {
  g_grad_enabled = false;
}
NoGradGuard::~NoGradGuard() {
  g_grad_enabled = previous_;
}

bool should_record(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

void record(std::unique_ptr<Node> node, std::initializer_list<const Tensor*> inputs, Tensor& out) {
  Tape& t = tape();
  for (const Tensor* in : inputs) {
    Edge edge;
    if (in->defined() && in->requires_grad()) {
      edge.shape = in->shape();
      if (in->is_leaf()) {
        edge.leaf = in->impl();
      } else if (!on_tape(t, *in->impl())) {
        throw AutogradError(str_cat("[", node->name(), "] input ", in->describe(), " ", kGoneTape));
      } else {
        edge.slot = in->impl()->tape_slot;
      }
    }
    node->inputs.push_back(std::move(edge));
  }
  node->id = g_next_node_id.fetch_add(1, std::memory_order_relaxed);
  node->module = current_module;
  const uint64_t id = node->id;
  auto& nodes = TapeAccess::nodes(t);
  nodes.push_back(std::move(node));  // may throw; out is untouched until it has succeeded
  out.impl()->requires_grad = true;
  out.impl()->tape_slot = static_cast<int64_t>(nodes.size() - 1);
  out.impl()->node_id = id;
}

size_t tape_size() {
  return TapeAccess::nodes(tape()).size();
}

void truncate_tape(size_t size) {
  Tape& t = tape();
  auto& nodes = TapeAccess::nodes(t);
  if (size < nodes.size()) nodes.resize(size);
}

void clear_tape() {
  TapeAccess::nodes(tape()).clear();
}

bool GradSink::needs(size_t i) const {
  return node_.inputs.at(i).active();
}

Tensor GradSink::grad_buffer(size_t i) {
  const Edge& edge = node_.inputs.at(i);
  if (!edge.leaf) return Tensor();
  if (!edge.leaf->grad) {
    Tensor leaf(edge.leaf);
    edge.leaf->grad = Tensor::zeros(leaf.shape(), leaf.dtype(), leaf.device()).impl();
  }
  return Tensor(edge.leaf->grad);
}

void GradSink::add(size_t i, const Tensor& g) {
  const Edge& edge = node_.inputs.at(i);
  if (!edge.active()) return;
  if (g.shape() != edge.shape) {
    throw AutogradError(str_cat("[", node_.name(), " backward] gradient for input ", i,
                                " has shape ", shape_str(g.shape()), " but the input has shape ",
                                shape_str(edge.shape)));
  }
  if (edge.leaf) {
    accumulate_into_leaf(*edge.leaf, g);
    return;
  }
  Tensor& slot = slots_[static_cast<size_t>(edge.slot)];
  if (!slot.defined()) {
    slot = g;
  } else {
    if (!exclusively_owned(slot)) slot = slot.clone();
    backend_for(slot.device()).axpy(1.0, g, slot);
  }
}

void GradSink::add_sums(size_t i, const Tensor& sums, DType input) {
  if (!needs(i)) return;
  const Tensor buffer = grad_buffer(i);
  add(i, buffer.defined() && buffer.dtype() == sums.dtype() ? sums : to_dtype(sums, input));
}

void backward(const Tensor& root) {
  run_backward(root, Tensor());
}

void backward(const Tensor& root, double seed) {
  if (root.numel() != 1) {
    throw AutogradError(str_cat("[backward] a scalar seed needs a one-element output, got ",
                                root.describe(), "; pass a seed tensor of that shape"));
  }
  run_backward(root, full(root.shape(), seed, root.dtype(), root.device()));
}

void backward(const Tensor& root, const Tensor& seed) {
  run_backward(root, seed);
}

void run_backward(const Tensor& root, const Tensor& seed) {
  if (!root.defined() || !root.requires_grad()) {
    throw AutogradError(
        "[backward] the tensor does not require grad: no recorded op produced it (was it "
        "computed under NoGradGuard, or from inputs that do not require grad?)");
  }
  Tensor grad = seed;
  if (!grad.defined()) {
    if (root.numel() != 1) {
      throw AutogradError(str_cat("[backward] output has shape ", shape_str(root.shape()),
                                  "; a non-scalar output needs an explicit seed tensor"));
    }
    grad = full(root.shape(), 1.0, root.dtype(), root.device());
  } else if (grad.shape() != root.shape() || grad.dtype() != root.dtype() ||
             grad.device() != root.device()) {
    throw AutogradError(str_cat("[backward] seed ", grad.describe(), " does not match the output ",
                                root.describe()));
  }
  Tape& t = tape();
  if (root.is_leaf()) {  // d root / d root = seed
    accumulate_into_leaf(*root.impl(), grad);
    return;
  }
  if (!on_tape(t, *root.impl())) {
    throw AutogradError(str_cat("[backward] the output ", root.describe(), " ", kGoneTape,
                                "; each micro-step must run its forward again"));
  }
  // The nodes' own arithmetic is not recorded: a backward that calls a recorded op (mul's
  // backward multiplies dy by a saved activation that requires grad) would otherwise append
  // nodes to the tape it consumes, each keeping its inputs alive until the walk ends.
  const NoGradGuard not_recorded;
  // Whatever happens below, the tape ends empty.
  struct Consume {
    Tape& t;
    ~Consume() { TapeAccess::nodes(t).clear(); }
  } consume{t};
  auto& nodes = TapeAccess::nodes(t);
  std::vector<Tensor> slots(nodes.size());
  slots[static_cast<size_t>(root.impl()->tape_slot)] = grad;
  grad = Tensor();
  // With a leaf-ready hook: how many nodes still to run feed each leaf.
  std::unordered_map<const TensorImpl*, int> pending;
  if (leaf_ready_hook != nullptr) {
    for (const auto& node : nodes) {
      for (const Edge& e : node->inputs) {
        if (e.leaf) ++pending[e.leaf.get()];
      }
    }
  }
  for (size_t i = nodes.size(); i-- > 0;) {
    std::unique_ptr<Node> node = std::move(nodes[i]);
    Tensor grad_out = std::move(slots[i]);
    if (grad_out.defined()) {
      const ProfileScope scope(node->name());  // ACCRUE_PROFILE's per-node table
      GradSink sink(*node, slots);
      try {
        node->check_saved();
        node->backward(grad_out, sink);
      } catch (...) {
        if (node->module != nullptr) rethrow_naming_module(node->module, "backward");
        throw;
      }
    }
    if (leaf_ready_hook != nullptr) {
      for (const Edge& e : node->inputs) {
        if (e.leaf && --pending[e.leaf.get()] == 0) (*leaf_ready_hook)(*e.leaf);
      }
    }
    // node (and its saved tensors) and grad_out are released here.
  }
}

ModuleScope::ModuleScope(const char* path) : previous_(current_module) {
  if (path != nullptr) current_module = path;
}

ModuleScope::~ModuleScope() {
  current_module = previous_;
}

const char* intern_module_path(const std::string& path) {
  static std::mutex mutex;
  static auto* paths = new std::set<std::string>;  // never destroyed: nodes may outlive modules
  const std::lock_guard<std::mutex> lock(mutex);
  return paths->insert(path).first->c_str();
}

void rethrow_naming_module(const char* module, const char* phase) {
  const std::string where = str_cat(kInModule, module, "'s ", phase, ")");
  try {
    throw;
  } catch (const NotCapturable& e) {
    append_where(e, where);
  } catch (const ShapeError& e) {
    append_where(e, where);
  } catch (const DTypeError& e) {
    append_where(e, where);
  } catch (const DeviceError& e) {
    append_where(e, where);
  } catch (const ValueError& e) {
    append_where(e, where);
  } catch (const AutogradError& e) {
    append_where(e, where);
  }
}

ScopedLeafReadyHook::ScopedLeafReadyHook(LeafReadyHook hook)
    : hook_(std::move(hook)), previous_(leaf_ready_hook) {
  leaf_ready_hook = &hook_;
}

ScopedLeafReadyHook::~ScopedLeafReadyHook() {
  leaf_ready_hook = previous_;
}

}  // namespace accrue
