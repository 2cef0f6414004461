// Tape-based reverse-mode autograd. Every op whose inputs need a gradient appends one Node to the
// thread's tape; the node is a named struct holding exactly what its backward needs. backward()
// walks the tape in reverse, frees each node (and so its saved activations) and each
// intermediate gradient as soon as it has been consumed, and leaves the tape empty: after a
// micro-backward the only live memory is parameters, gradients, optimizer state and data.
//
// Gradients of leaves are accumulated in place into their persistent `grad` buffer (for
// parameters, a view of the gradient arena). A node that can write its input gradient directly
// (the weight-gradient GEMM with beta = 1) asks GradSink::grad_buffer() for that buffer; other
// nodes hand a fresh tensor to GradSink::add(). Read next: ops/linear.cpp.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace accrue {

// Where the gradient of one node input goes: an intermediate tape slot or a leaf's buffer.
struct Edge {
  int64_t slot = -1;                 // producing node on the tape, or -1
  std::shared_ptr<TensorImpl> leaf;  // leaf that requires grad, or null
  Shape shape;                       // the input's shape, to check gradients against
  bool active() const { return slot >= 0 || leaf != nullptr; }
};

class GradSink;

struct Node {
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  // grad_out has the shape of this node's output. Deposit each input's gradient into sink.
  virtual void backward(const Tensor& grad_out, GradSink& sink) = 0;
  // Keeps t for backward and remembers its storage's version: backward throws, naming this
  // node, if t was modified in place in between. Every tensor a node saves goes through here:
  //   node->x = node->save(x);
  const Tensor& save(const Tensor& t);
  // Throws AutogradError if a saved tensor changed since save().
  void check_saved() const;

  std::vector<Edge> inputs;
  uint64_t id = 0;               // process-wide unique, set by record()
  const char* module = nullptr;  // the module whose forward recorded it (ModuleScope), if any

 private:
  struct Saved {
    Tensor tensor;
    uint64_t version;
  };
  std::vector<Saved> saved_;
};

// Receives the gradients a node produces for its inputs during backward.
class GradSink {
 public:
  // Whether input i needs a gradient at all.
  bool needs(size_t i) const;
  // For a leaf input: its persistent gradient buffer (created as zeros on first use), into which
  // the node may accumulate directly, e.g. with a GEMM's beta = 1. Undefined for other inputs.
  Tensor grad_buffer(size_t i);
  // Adds g to input i's gradient: in place into a leaf's buffer, or into the tape slot.
  void add(size_t i, const Tensor& g);
  // Adds sums taken wider than the input's 16-bit dtype (float32): as they are into a leaf's
  // buffer of their dtype (mixed precision's float32 buffers), else rounded once to `input`.
  void add_sums(size_t i, const Tensor& sums, DType input);

 private:
  friend void run_backward(const Tensor&, const Tensor&);
  GradSink(Node& node, std::vector<Tensor>& slots) : node_(node), slots_(slots) {}
  Node& node_;
  std::vector<Tensor>& slots_;
};

// True while no NoGradGuard is alive on this thread.
bool grad_enabled();

// Disables recording on this thread for its lifetime (evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// A tape of its own, for a micro-batch that stays in flight while others run (the pipeline
// schedules, distributed/pipeline.h): while a TapeScope for it lives, ops on this thread record
// onto it and backward() consumes it, leaving the thread's own tape untouched. Each in-flight
// micro-batch holds its activations on its tape until its backward; destroying a tape drops
// what is left on it. A tensor recorded on one tape cannot feed an op or a backward on another.
class Tape {
 public:
  Tape() = default;
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  size_t size() const { return nodes_.size(); }
  bool empty() const { return nodes_.empty(); }

 private:
  friend class TapeScope;
  friend struct TapeAccess;                   // the tape walk in autograd.cpp
  std::vector<std::unique_ptr<Node>> nodes_;  // node i produced tape slot i
  bool active_ = false;
};

// Makes `tape` this thread's tape for its lifetime (nested: the inner wins). A tape is active
// in at most one scope at a time.
class TapeScope {
 public:
  explicit TapeScope(Tape& tape);
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  Tape& tape_;
  Tape* previous_;
};

// The tape ops record onto now: the innermost TapeScope's, else the thread's own.
Tape& active_tape();

// Whether an op over these inputs must be recorded.
bool should_record(std::initializer_list<const Tensor*> inputs);
// Appends node to the tape with edges for `inputs` and marks `out` as its result.
void record(std::unique_ptr<Node> node, std::initializer_list<const Tensor*> inputs, Tensor& out);
// Number of nodes waiting on the active tape.
size_t tape_size();
// Drops the nodes recorded after the tape had `size` nodes: what a forward that throws halfway
// recorded (Module::operator() does this), so the next backward never meets them.
void truncate_tape(size_t size);
// Drops every node on the tape without running backward (e.g. after an evaluation that
// recorded by mistake, or to abandon a micro-step).
void clear_tape();

// Runs backward from `root` seeded with `seed` (undefined: 1, allowed only for one element).
void run_backward(const Tensor& root, const Tensor& seed);
// backward(loss): the tape backward from a one-element root seeded with 1; backward(loss, s)
// with the value s; backward(out, seed) with a seed tensor of out's shape.
void backward(const Tensor& root);
void backward(const Tensor& root, double seed);
void backward(const Tensor& root, const Tensor& seed);

// The module whose forward runs on this thread (nn::Module::operator() opens one per registered
// module; nested: the inner wins): the nodes recorded meanwhile keep its path, so an op's error
// in their backward names the module as an error in its forward does. Paths are interned for
// the process (intern_module_path), as nodes outlive no module's name.
class ModuleScope {
 public:
  explicit ModuleScope(const char* path);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  const char* previous_;
};
const char* intern_module_path(const std::string& path);
// Inside a catch block: rethrows the exception in flight, an op's error (ShapeError, DTypeError,
// DeviceError, ValueError, AutogradError), as the same type with " (in module M's forward)" (or
// backward) appended, unless an inner module already named itself; any other exception as is.
[[noreturn]] void rethrow_naming_module(const char* module, const char* phase);

// Called during backward, on this thread, as soon as a leaf's gradient is final: no node left on
// the tape will add to it. Data parallelism starts the all-reduce of a bucket of the gradient
// arena from here while backward goes on with the earlier layers.
using LeafReadyHook = std::function<void(const TensorImpl& leaf)>;
// Installs a hook for this thread's backward passes for its lifetime (nested: the inner wins).
class ScopedLeafReadyHook {
 public:
  explicit ScopedLeafReadyHook(LeafReadyHook hook);
  ~ScopedLeafReadyHook();
  ScopedLeafReadyHook(const ScopedLeafReadyHook&) = delete;
  ScopedLeafReadyHook& operator=(const ScopedLeafReadyHook&) = delete;

 private:
  LeafReadyHook hook_;
  LeafReadyHook* previous_;
};

}  // namespace accrue
