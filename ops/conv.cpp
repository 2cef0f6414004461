// conv2d, max_pool2d (and max_pool2d_relu), avg_pool2d and flatten, NCHW. The convolution's
// backward accumulates the filter and bias gradients straight into the parameters' gradient buffers
// (beta = 1, as the Linear layers do) when they are leaves; the pooling backward nodes keep only
// what they need (max: the argmax indices; average: nothing but the geometry). Read next:
// ops/norm.cpp.
#include <memory>

#include "kernels/backend.h"
#include "ops/autograd.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace accrue {

namespace {

// Throws unless x is 4-D [N, C, H, W].
void check_nchw(const char* op, const Tensor& x) {
  check::floating(op, "input", x);
  if (x.dim() != 4) {
    throw ShapeError(
        str_cat("[", op, "] input must be 4-D [N, C, H, W], got shape ", shape_str(x.shape())));
  }
}

// The output height or width; throws when the kernel does not fit.
int64_t out_size(const char* op, const char* axis, int64_t in, int64_t kernel, int64_t stride,
                 int64_t pad, int64_t dilation) {
  if (kernel < 1 || stride < 1 || pad < 0 || dilation < 1) {
    throw ValueError(str_cat("[", op, "] ", axis, ": kernel ", kernel, ", stride ", stride,
                             ", padding ", pad, ", dilation ", dilation,
                             " (need kernel, stride, dilation >= 1 and padding >= 0)"));
  }
  const int64_t out = conv2d_out_size(in, kernel, stride, pad, dilation);
  if (out < 1) {
    throw ShapeError(str_cat("[", op, "] ", axis, " ", in, " with padding ", pad,
                             " is smaller than the kernel (size ", kernel, ", dilation ", dilation,
                             ")"));
  }
  return out;
}

// y = conv2d(x, w) + bias. dx = conv2d_backward_data, dw and dbias from conv2d_backward_filter.
struct Conv2dBackward : Node {
  Tensor x, w;
  Conv2dGeometry g;
  const char* name() const override { return "conv2d"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Backend& be = backend_for(dy.device());
    if (x.size(0) == 0) {  // an empty batch: no input gradient, nothing to add to the others
      if (sink.needs(0)) sink.add(0, Tensor::empty(x.shape(), x.dtype(), x.device()));
      for (size_t i : {size_t{1}, size_t{2}}) {
        if (sink.needs(i) && !sink.grad_buffer(i).defined()) {
          sink.add(i, Tensor::zeros(i == 1 ? w.shape() : Shape{w.size(0)}, w.dtype(), w.device()));
        }
      }
      return;
    }
    if (sink.needs(0)) {
      Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
      be.conv2d_backward_data(dy, w, g, dx);
      sink.add(0, dx);
    }
    if (!sink.needs(1) && !sink.needs(2)) return;
    Tensor dw = sink.grad_buffer(1), db = sink.needs(2) ? sink.grad_buffer(2) : Tensor();
    const bool direct = dw.defined() && (!sink.needs(2) || db.defined());
    if (direct) {  // parameters: straight into their gradient buffers
      be.conv2d_backward_filter(dy, x, g, 1.0, dw, db);
      return;
    }
    dw = Tensor::empty(w.shape(), w.dtype(), w.device());
    db = sink.needs(2) ? Tensor::empty({w.size(0)}, w.dtype(), w.device()) : Tensor();
    be.conv2d_backward_filter(dy, x, g, 0.0, dw, db);
    if (sink.needs(1)) sink.add(1, dw);
    if (sink.needs(2)) sink.add(2, db);
  }
};

struct MaxPool2dBackward : Node {
  Tensor argmax;  // int32, the output's shape; -1 where nothing flows back (max_pool2d_relu)
  Shape input_shape;
  const char* op = "max_pool2d";
  const char* name() const override { return op; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor dx = Tensor::empty(input_shape, dy.dtype(), dy.device());
    backend_for(dy.device()).max_pool2d_backward(dy, argmax, dx);
    sink.add(0, dx);
  }
};

struct AvgPool2dBackward : Node {
  Pool2dGeometry g;
  Shape input_shape;
  const char* name() const override { return "avg_pool2d"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor dx = Tensor::empty(input_shape, dy.dtype(), dy.device());
    backend_for(dy.device()).avg_pool2d_backward(dy, g, dx);
    sink.add(0, dx);
  }
};

}  // namespace

Shape check::pool2d_shape(const char* op, const Tensor& x, const Pool2dGeometry& g) {
  check_nchw(op, x);
  if (x.size(2) == 0 || x.size(3) == 0) {  // padding would give every region nothing to pool
    throw ShapeError(
        str_cat("[", op, "] input ", shape_str(x.shape()), " has empty planes: nothing to pool"));
  }
  if (g.pad_h * 2 > g.kernel_h || g.pad_w * 2 > g.kernel_w) {
    throw ValueError(str_cat("[", op, "] padding ", g.pad_h, "x", g.pad_w,
                             " must be at most half the kernel ", g.kernel_h, "x", g.kernel_w));
  }
  return {x.size(0), x.size(1),
          out_size(op, "height", x.size(2), g.kernel_h, g.stride_h, g.pad_h, 1),
          out_size(op, "width", x.size(3), g.kernel_w, g.stride_w, g.pad_w, 1)};
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dGeometry& g) {
  check_nchw("conv2d", x);
  check::compatible("conv2d", x, weight);
  if (weight.dim() != 4 || weight.size(1) != x.size(1)) {
    throw ShapeError(str_cat("[conv2d] weight must be [out, in = ", x.size(1),
                             ", kh, kw] for input ", shape_str(x.shape()), ", got ",
                             shape_str(weight.shape())));
  }
  if (bias.defined()) {
    check::compatible("conv2d", x, bias);
    if (bias.dim() != 1 || bias.size(0) != weight.size(0)) {
      throw ShapeError(str_cat("[conv2d] bias has shape ", shape_str(bias.shape()),
                               " but weight has ", weight.size(0), " output channels"));
    }
  }
  const Shape out_shape{
      x.size(0), weight.size(0),
      out_size("conv2d", "height", x.size(2), weight.size(2), g.stride_h, g.pad_h, g.dilation_h),
      out_size("conv2d", "width", x.size(3), weight.size(3), g.stride_w, g.pad_w, g.dilation_w)};
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (x.size(0) > 0) backend_for(x.device()).conv2d_forward(x, weight, bias, g, out);
  if (should_record({&x, &weight, &bias})) {
    auto node = std::make_unique<Conv2dBackward>();
    node->x = node->save(x);
    node->w = node->save(weight);
    node->g = g;
    record(std::move(node), {&x, &weight, &bias}, out);
  }
  return out;
}

namespace {

// max_pool2d and max_pool2d_relu: one primitive, the ReLU applied per tap or not.
Tensor max_pool(const char* op, const Tensor& x, const Pool2dGeometry& g, bool relu) {
  const Shape shape = check::pool2d_shape(op, x, g);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  Tensor argmax = Tensor::empty(shape, DType::kInt32, x.device());
  backend_for(x.device()).max_pool2d(x, g, relu, out, argmax);
  if (should_record({&x})) {
    auto node = std::make_unique<MaxPool2dBackward>();
    node->op = op;
    node->argmax = argmax;
    node->input_shape = x.shape();
    record(std::move(node), {&x}, out);
  }
  return out;
}

}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dGeometry& g) {
  return max_pool("max_pool2d", x, g, false);
}

Tensor max_pool2d_relu(const Tensor& x, const Pool2dGeometry& g) {
  return max_pool("max_pool2d_relu", x, g, true);
}

Tensor avg_pool2d(const Tensor& x, const Pool2dGeometry& g) {
  const Shape shape = check::pool2d_shape("avg_pool2d", x, g);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  backend_for(x.device()).avg_pool2d(x, g, out);
  if (should_record({&x})) {
    auto node = std::make_unique<AvgPool2dBackward>();
    node->g = g;
    node->input_shape = x.shape();
    record(std::move(node), {&x}, out);
  }
  return out;
}

Tensor flatten(const Tensor& x) {
  check::defined("flatten", "input", x);
  if (x.dim() < 1) throw ShapeError("[flatten] input must have a batch dimension, got a scalar");
  int64_t rest = 1;  // the product of the other dimensions, also for an empty batch
  for (int64_t d = 1; d < x.dim(); ++d) rest *= x.size(d);
  return reshape(x, {x.size(0), rest});
}

}  // namespace accrue
