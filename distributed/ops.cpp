// The differentiable collectives (see ops.h): forward through the communicator, a tape node
// whose backward is the transposed collective.
#include "distributed/ops.h"

#include <memory>

#include "core/error.h"
#include "kernels/backend.h"
#include "ops/autograd.h"

namespace accrue::distributed {
namespace {

void check_input(const char* op, const Tensor& x) {
  if (x.dim() < 1) {
    throw ShapeError(str_cat("[", op, "] needs at least one dimension, got ", x.describe()));
  }
}

// dy [world * n, ...] -> this rank's [n, ...] of the sum over ranks.
struct AllGatherBackward : Node {
  Communicator* comm;
  Shape in_shape;
  const char* name() const override { return "all_gather"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor g = Tensor::empty(in_shape, dy.dtype(), dy.device());
    comm->reduce_scatter(dy, g);
    sink.add(0, g);
  }
};

// dy -> the sum over ranks of dy.
struct AllReduceSumBackward : Node {
  Communicator* comm;
  const char* name() const override { return "all_reduce_sum"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor g = dy.clone();
    comm->all_reduce_sum(g);
    sink.add(0, g);
  }
};

}  // namespace

Tensor all_gather(const Tensor& x, Communicator& comm) {
  check_input("all_gather", x);
  Shape shape = x.shape();
  shape[0] *= comm.world_size();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  comm.all_gather(x, out);
  if (should_record({&x})) {
    auto node = std::make_unique<AllGatherBackward>();
    node->comm = &comm;
    node->in_shape = x.shape();
    record(std::move(node), {&x}, out);
  }
  return out;
}

Tensor all_reduce_sum(const Tensor& x, Communicator& comm) {
  Tensor out = x.clone();
  comm.all_reduce_sum(out);
  if (should_record({&x})) {
    auto node = std::make_unique<AllReduceSumBackward>();
    node->comm = &comm;
    record(std::move(node), {&x}, out);
  }
  return out;
}

}  // namespace accrue::distributed
