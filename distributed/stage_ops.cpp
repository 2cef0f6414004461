// The stage boundary's send and receive (see stage_ops.h): a header [dtype, ndim, dims...] and the
// data, and the tape nodes whose backward moves the gradient the other way.
#include "distributed/stage_ops.h"

#include <chrono>
#include <memory>
#include <vector>

#include "core/error.h"
#include "ops/autograd.h"

namespace accrue::distributed {
namespace {

thread_local double g_wait_seconds = 0;

// transfer.wait(), its time added to boundary_wait_seconds().
void timed_wait(Transfer& transfer) {
  const auto start = std::chrono::steady_clock::now();
  transfer.wait();
  g_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

constexpr int kMaxDims = 8;
constexpr int kHeaderLength = 2 + kMaxDims;  // dtype, ndim, then the dims (unused ones 0)

Tensor make_header(DType dtype, const Shape& shape) {
  if (shape.size() > kMaxDims) {
    throw ShapeError(
        str_cat("[send_activation] at most ", kMaxDims, " dimensions, got ", shape_str(shape)));
  }
  std::vector<int64_t> values(kHeaderLength, 0);
  values[0] = static_cast<int64_t>(dtype);
  values[1] = static_cast<int64_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) values[2 + i] = shape[i];
  return Tensor::from_vector({kHeaderLength}, values);
}

// The shape a header announces, after checking its dtype is the one this stage expects.
Shape read_header(const Tensor& header, DType expected, int prev, int micro) {
  const auto* values = header.data<int64_t>();
  if (values[0] != static_cast<int64_t>(expected)) {
    const bool known = values[0] >= 0 && values[0] <= static_cast<int64_t>(DType::kInt64);
    throw DTypeError(str_cat("[recv_activation] rank ", prev, " sent micro-batch ", micro, " as ",
                             known ? dtype_name(static_cast<DType>(values[0])) : "an unknown dtype",
                             ", this stage expects ", dtype_name(expected)));
  }
  const int64_t ndim = values[1];
  if (ndim < 0 || ndim > kMaxDims) {
    throw ValueError(str_cat("[recv_activation] rank ", prev, " sent micro-batch ", micro, " with ",
                             ndim, " dimensions: the ranks run different programs"));
  }
  Shape shape(values + 2, values + 2 + ndim);
  for (const int64_t d : shape) {
    if (d < 0) {
      throw ValueError(str_cat("[recv_activation] rank ", prev, " sent micro-batch ", micro,
                               " with shape ", shape_str(shape)));
    }
  }
  return shape;
}

// The sending stage's token: its backward waits for dL/dy from the next stage (posted when y
// was sent) and hands it to y.
struct SendActivationBackward : Node {
  std::unique_ptr<Transfer> header_sent, data_sent, gradient_received;
  Tensor gradient;
  const char* name() const override { return "send_activation"; }
  void backward(const Tensor&, GradSink& sink) override {
    // The next stage received y before it could send its gradient: these complete at once.
    header_sent->wait();
    data_sent->wait();
    timed_wait(*gradient_received);
    sink.add(0, gradient);
  }
};

// The receiving stage's input: its backward sends dL/dx to the previous stage, whose receive
// was posted when it sent x, so the wait is short.
struct RecvActivationBackward : Node {
  Communicator* comm = nullptr;
  int prev = 0, micro = 0;
  const char* name() const override { return "recv_activation"; }
  void backward(const Tensor& dx, GradSink&) override {
    comm->isend(dx, prev, gradient_tag(micro))->wait();
  }
};

}  // namespace

double boundary_wait_seconds() {
  return g_wait_seconds;
}

int activation_tag(int micro) {
  if (micro < 0 || micro > (32767 - 1) / 2) {
    throw ValueError(str_cat("[pipeline] micro-batch ", micro,
                             " of a window: the tags allow 0 .. 16383 (MPI guarantees 32767)"));
  }
  return 2 * micro;
}

int gradient_tag(int micro) {
  return activation_tag(micro) + 1;
}

Tensor send_activation(const Tensor& y, int next, int micro, Communicator& comm) {
  const int tag = activation_tag(micro);
  auto node = std::make_unique<SendActivationBackward>();
  node->header_sent = comm.isend(make_header(y.dtype(), y.shape()), next, tag);
  node->data_sent = comm.isend(y, next, tag);
  if (!(grad_enabled() && y.requires_grad())) {
    node->header_sent->wait();
    node->data_sent->wait();
    return Tensor();
  }
  node->gradient = Tensor::empty(y.shape(), y.dtype(), y.device());
  node->gradient_received = comm.irecv(node->gradient, next, gradient_tag(micro));
  Tensor token = Tensor::zeros({1}, y.dtype(), y.device());
  record(std::move(node), {&y}, token);
  return token;
}

Tensor recv_activation(int prev, int micro, DType dtype, Device device, Communicator& comm) {
  const int tag = activation_tag(micro);
  Tensor header = Tensor::empty({kHeaderLength}, DType::kInt64);
  timed_wait(*comm.irecv(header, prev, tag));
  Tensor x = Tensor::empty(read_header(header, dtype, prev, micro), dtype, device);
  timed_wait(*comm.irecv(x, prev, tag));
  if (grad_enabled()) {
    auto node = std::make_unique<RecvActivationBackward>();
    node->comm = &comm;
    node->prev = prev;
    node->micro = micro;
    record(std::move(node), {}, x);
  }
  return x;
}

}  // namespace accrue::distributed
