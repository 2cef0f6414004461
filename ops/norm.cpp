// batch_norm, group_norm and layer_norm over x [N, C, ...] (viewed as [N, C, S]), group_norm
// fused with the ReLU and max pooling after it (group_norm_relu_max_pool2d), and dropout.
// The normalisations save their input and the statistics they used; their backward nodes
// accumulate the affine gradients straight into the parameters' gradient buffers when those
// are leaves. BatchNorm normalises with the statistics of the batch it is given (a micro-batch
// under accumulation: the caveat tests/test_norm_caveat.cpp measures) and updates the running
// statistics in place on every training call. A 16-bit x normalises in float32: on the CPU the
// kernels read it in 16 bits, elsewhere through recorded float32 copies (on_float32_copies).
// Dropout draws a counter-based mask (kernels/functors.h) from the key and each row's sample index.
// Read next: nn/conv.h.
#include <memory>

#include "core/graph.h"
#include "kernels/backend.h"
#include "ops/autograd.h"
#include "ops/check.h"
#include "ops/ops.h"

namespace accrue {

namespace {

// x viewed as [N, C, S].
Tensor as_ncs(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  return x.view({n, c, n * c != 0 ? x.numel() / (n * c) : 0});
}

void check_channels(const char* op, const Tensor& t, const char* what, int64_t channels) {
  if (t.numel() != channels) {
    throw ShapeError(str_cat("[", op, "] ", what, " has shape ", shape_str(t.shape()), " but ",
                             channels, " channels are normalised"));
  }
}

void check_affine(const char* op, const Tensor& x, const Tensor& t, const char* what,
                  int64_t channels) {
  if (!t.defined()) return;
  check::compatible(op, x, t);
  check_channels(op, t, what, channels);
}

// Running statistics: float32 beside a 16-bit x (the dtype its statistics are computed in), x's
// own dtype otherwise.
void check_running(const char* op, const Tensor& x, const Tensor& t, const char* what,
                   int64_t channels) {
  if (!t.defined()) return;
  check::same_device(op, x, t);
  if (t.dtype() != compute_dtype(x.dtype())) {
    throw DTypeError(str_cat("[", op, "] ", what, " of a ", dtype_name(x.dtype()),
                             " input must be ", dtype_name(compute_dtype(x.dtype())), ", got ",
                             t.describe()));
  }
  check_channels(op, t, what, channels);
}

// Fetches the gradient buffers for the affine inputs (indices 1 and 2, of the given shapes), in
// the compute dtype of x (`like`): the leaves' own when they all are leaves of that dtype (beta =
// 1; mixed precision's parameters, 16-bit working copies, have float32 gradient buffers), else
// fresh tensors, added to the sink after `run` (GradSink::add_sums: a float32 buffer never takes
// a sum rounded to 16 bits).
template <typename Run>
void affine_backward(GradSink& sink, const Tensor& like, int64_t channels, const Shape& w_shape,
                     const Shape& b_shape, Run run) {
  const DType sums = compute_dtype(like.dtype());
  Tensor dw = sink.needs(1) ? sink.grad_buffer(1) : Tensor();
  Tensor db = sink.needs(2) ? sink.grad_buffer(2) : Tensor();
  const bool dw_fits = dw.defined() && dw.dtype() == sums,
             db_fits = db.defined() && db.dtype() == sums;
  if ((!sink.needs(1) || dw_fits) && (!sink.needs(2) || db_fits)) {
    run(1.0, dw, db);
    return;
  }
  dw = sink.needs(1) ? Tensor::empty({channels}, sums, like.device()) : Tensor();
  db = sink.needs(2) ? Tensor::empty({channels}, sums, like.device()) : Tensor();
  run(0.0, dw, db);
  if (dw.defined()) sink.add_sums(1, dw.view(w_shape), like.dtype());
  if (db.defined()) sink.add_sums(2, db.view(b_shape), like.dtype());
}

// The backward of a normalisation over no elements: an empty input gradient, zero affine
// gradients (nothing added to a leaf's buffer).
void empty_backward(GradSink& sink, const Tensor& x, const Shape& input_shape, const Shape& w_shape,
                    const Shape& b_shape) {
  if (sink.needs(0)) sink.add(0, Tensor::empty(input_shape, x.dtype(), x.device()));
  for (size_t i : {size_t{1}, size_t{2}}) {
    if (sink.needs(i) && !sink.grad_buffer(i).defined()) {
      sink.add(i, Tensor::zeros(i == 1 ? w_shape : b_shape, x.dtype(), x.device()));
    }
  }
}

struct GroupNormBackward : Node {
  const char* op = "group_norm";  // or "layer_norm", one group of every feature
  Tensor x, mean, rstd, weight;   // x as [N, C, S]
  int64_t groups = 1;
  Shape input_shape, weight_shape, bias_shape;
  const char* name() const override { return op; }
  void backward(const Tensor& dy, GradSink& sink) override {
    if (x.numel() == 0) return empty_backward(sink, x, input_shape, weight_shape, bias_shape);
    Backend& be = backend_for(dy.device());
    const Tensor g = dy.view(x.shape());
    Tensor dx = sink.needs(0) ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
    // One primitive call writes dx and the affine gradients (each when defined): its pass over
    // dy and x gives both their sums.
    affine_backward(sink, x, x.size(1), weight_shape, bias_shape,
                    [&](double beta, Tensor& dw, Tensor& db) {
                      if (!dx.defined() && !dw.defined() && !db.defined()) return;
                      be.group_norm_backward(g, x, groups, mean, rstd, weight, dx, beta, dw, db);
                    });
    if (dx.defined()) sink.add(0, dx.view(input_shape));
  }
};

// The fused group_norm_relu_max_pool2d: the pooled dy and the argmax in, dx and the affine
// gradients out, in one primitive call.
struct GroupNormReluMaxPoolBackward : Node {
  Tensor x, argmax, mean, rstd, weight;  // x [N, C, H, W]
  int64_t groups = 1;
  Pool2dGeometry pool;
  Shape weight_shape, bias_shape;
  const char* name() const override { return "group_norm_relu_max_pool2d"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Backend& be = backend_for(dy.device());
    Tensor dx = sink.needs(0) ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
    affine_backward(sink, x, x.size(1), weight_shape, bias_shape,
                    [&](double beta, Tensor& dw, Tensor& db) {
                      if (!dx.defined() && !dw.defined() && !db.defined()) return;
                      be.group_norm_relu_max_pool2d_backward(dy, argmax, x, groups, mean, rstd,
                                                             weight, pool, dx, beta, dw, db);
                    });
    if (dx.defined()) sink.add(0, dx);
  }
};

struct BatchNormBackward : Node {
  Tensor x, mean, rstd, weight;  // x as [N, C, S]
  bool use_running = false;
  Shape input_shape, weight_shape, bias_shape;
  const char* name() const override { return "batch_norm"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    if (x.numel() == 0) return empty_backward(sink, x, input_shape, weight_shape, bias_shape);
    Backend& be = backend_for(dy.device());
    const Tensor g = dy.view(x.shape());
    Tensor dx = sink.needs(0) ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor();
    affine_backward(
        sink, x, x.size(1), weight_shape, bias_shape, [&](double beta, Tensor& dw, Tensor& db) {
          if (!dx.defined() && !dw.defined() && !db.defined()) return;
          be.batch_norm_backward(g, x, use_running, mean, rstd, weight, dx, beta, dw, db);
        });
    if (dx.defined()) sink.add(0, dx.view(input_shape));
  }
};

struct DropoutBackward : Node {
  DropoutKey key;
  Tensor samples;
  const char* name() const override { return "dropout"; }
  void backward(const Tensor& dy, GradSink& sink) override {
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    backend_for(dy.device()).dropout(dy, key, samples, dx);
    sink.add(0, dx);
  }
};

void check_batched(const char* op, const Tensor& x, int64_t min_dim) {
  check::floating(op, "input", x);
  if (x.dim() < min_dim) {
    throw ShapeError(str_cat("[", op, "] input must be at least ", min_dim, "-D [N, C, ...], got ",
                             "shape ", shape_str(x.shape())));
  }
}

// group_norm's checks, under the name of the op that runs them.
void check_group_norm(const char* op, const Tensor& x, int64_t groups, const Tensor& weight,
                      const Tensor& bias, double eps) {
  check_batched(op, x, 2);
  const int64_t channels = x.size(1);
  if (groups < 1 || channels % groups != 0) {
    throw ValueError(
        str_cat("[", op, "] ", channels, " channels do not split into ", groups, " groups"));
  }
  if (!(eps > 0)) throw ValueError(str_cat("[", op, "] eps must be > 0, got ", eps));
  check_affine(op, x, weight, "weight", channels);
  check_affine(op, x, bias, "bias", channels);
}

// group_norm under the op's name (its checks' messages, its tape node's profile row).
Tensor normalize_groups(const char* op, const Tensor& x, int64_t groups, const Tensor& weight,
                        const Tensor& bias, double eps) {
  check_group_norm(op, x, groups, weight, bias, eps);
  const int64_t channels = x.size(1);
  const Tensor xs = as_ncs(x);
  Tensor out = Tensor::empty(xs.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({x.size(0), groups}, compute_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({x.size(0), groups}, compute_dtype(x.dtype()), x.device());
  const Tensor w = weight.defined() ? weight.view({channels}) : Tensor();
  const Tensor b = bias.defined() ? bias.view({channels}) : Tensor();
  if (x.numel() > 0) backend_for(x.device()).group_norm(xs, groups, eps, w, b, out, mean, rstd);
  out = out.view(x.shape());
  if (should_record({&x, &weight, &bias})) {
    auto node = std::make_unique<GroupNormBackward>();
    node->op = op;
    node->x = node->save(xs);
    node->mean = mean;
    node->rstd = rstd;
    node->weight = w.defined() ? node->save(w) : Tensor();
    node->groups = groups;
    node->input_shape = x.shape();
    node->weight_shape = weight.defined() ? weight.shape() : Shape{};
    node->bias_shape = bias.defined() ? bias.shape() : Shape{};
    record(std::move(node), {&x, &weight, &bias}, out);
  }
  return out;
}

// Where a 16-bit input does not go to the kernels in 16 bits (on_float32_copies below):
// its statistics and affine run in float32 on float32 copies of x and the affine parameters
// (recorded casts, so their gradients flow back in 16 bits), the result cast back to x's dtype.
Tensor widened(const Tensor& t) {
  return t.defined() ? cast(t, DType::kFloat32) : t;
}

// Whether x is normalised on those copies: a 16-bit x off the CPU. The CPU kernels read and write
// 16 bits and compute in float32 themselves, the same values as the copies give
// (kernels/cpu/norm.cpp); the CUDA kernels take float32 and float64.
bool on_float32_copies(const Tensor& x) {
  return is_half(x.dtype()) && !x.device().is_cpu();
}

}  // namespace

Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (on_float32_copies(x)) {
    check_group_norm("group_norm", x, groups, weight, bias, eps);  // the 16-bit operands' dtypes
    return cast(group_norm(widened(x), groups, widened(weight), widened(bias), eps), x.dtype());
  }
  return normalize_groups("group_norm", x, groups, weight, bias, eps);
}

Tensor group_norm_relu_max_pool2d(const Tensor& x, int64_t groups, const Tensor& weight,
                                  const Tensor& bias, const Pool2dGeometry& pool, double eps) {
  if (on_float32_copies(x)) {
    check_group_norm("group_norm_relu_max_pool2d", x, groups, weight, bias, eps);
    return cast(
        group_norm_relu_max_pool2d(widened(x), groups, widened(weight), widened(bias), pool, eps),
        x.dtype());
  }
  const char* op = "group_norm_relu_max_pool2d";
  check_group_norm(op, x, groups, weight, bias, eps);
  const Shape shape = check::pool2d_shape(op, x, pool);
  if (x.numel() == 0) return max_pool2d_relu(group_norm(x, groups, weight, bias, eps), pool);
  const int64_t channels = x.size(1);
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  Tensor argmax = Tensor::empty(shape, DType::kInt32, x.device());
  Tensor mean = Tensor::empty({x.size(0), groups}, compute_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({x.size(0), groups}, compute_dtype(x.dtype()), x.device());
  const Tensor w = weight.defined() ? weight.view({channels}) : Tensor();
  const Tensor b = bias.defined() ? bias.view({channels}) : Tensor();
  backend_for(x.device())
      .group_norm_relu_max_pool2d(x, groups, eps, w, b, pool, out, argmax, mean, rstd);
  if (should_record({&x, &weight, &bias})) {
    auto node = std::make_unique<GroupNormReluMaxPoolBackward>();
    node->x = node->save(x);
    node->argmax = argmax;
    node->mean = mean;
    node->rstd = rstd;
    node->weight = w.defined() ? node->save(w) : Tensor();
    node->groups = groups;
    node->pool = pool;
    node->weight_shape = weight.defined() ? weight.shape() : Shape{};
    node->bias_shape = bias.defined() ? bias.shape() : Shape{};
    record(std::move(node), {&x, &weight, &bias}, out);
  }
  return out;
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_batched("layer_norm", x, 2);
  // Each sample's features as the channels of one group: per-element affine.
  // The product of the dimensions after the first: an empty batch still has its features.
  int64_t features = 1;
  for (size_t d = 1; d < x.shape().size(); ++d) features *= x.shape()[d];
  for (const Tensor* t : {&weight, &bias}) {
    if (t->defined() && t->numel() != features) {
      throw ShapeError(str_cat("[layer_norm] ", t == &weight ? "weight" : "bias", " has shape ",
                               shape_str(t->shape()), " but each sample has ", features,
                               " features (shape ", shape_str(x.shape()), ")"));
    }
  }
  if (on_float32_copies(x)) {
    for (const Tensor* t : {&weight, &bias}) {  // the dtypes the CPU path checks, here too
      if (t->defined()) check::compatible("layer_norm", x, *t);
    }
    return cast(layer_norm(widened(x), widened(weight), widened(bias), eps), x.dtype());
  }
  return reshape(
      normalize_groups("layer_norm", reshape(x, {x.size(0), features, 1}), 1, weight, bias, eps),
      x.shape());
}

namespace {

// A 16-bit input's batch norm through float32 copies (widened), off the CPU (on_float32_copies) or
// where its running statistics are 16-bit too. Those may be float32 (mixed precision's buffers stay
// in the master dtype), updated in place, or x's own 16-bit dtype (a model built in 16 bits),
// updated through float32 copies that are rounded back once per call.
Tensor batch_norm_widened(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          Tensor running_mean, Tensor running_var, bool training, double momentum,
                          double eps) {
  const int64_t channels = x.size(1);
  check_affine("batch_norm", x, weight, "weight", channels);
  check_affine("batch_norm", x, bias, "bias", channels);
  const auto as_float = [&](const Tensor& stat, const char* what) {
    if (!stat.defined() || stat.dtype() == DType::kFloat32) return stat;
    if (stat.dtype() != x.dtype()) {
      throw DTypeError(str_cat("[batch_norm] ", what, " of a ", dtype_name(x.dtype()),
                               " input must be float32 or ", dtype_name(x.dtype()), ", got ",
                               stat.describe()));
    }
    return to_dtype(stat, DType::kFloat32);
  };
  Tensor mean32 = as_float(running_mean, "running_mean");
  Tensor var32 = as_float(running_var, "running_var");
  Tensor out = cast(batch_norm(widened(x), widened(weight), widened(bias), mean32, var32, training,
                               momentum, eps),
                    x.dtype());
  if (training) {
    for (auto [stat, stat32] : {std::pair{running_mean, mean32}, std::pair{running_var, var32}}) {
      if (stat.defined() && stat.dtype() != DType::kFloat32) {
        stat.copy_(to_dtype(stat32, stat.dtype()));
      }
    }
  }
  return out;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, double momentum, double eps) {
  check_batched("batch_norm", x, 2);
  const auto float32_or_none = [](const Tensor& t) {
    return !t.defined() || t.dtype() == DType::kFloat32;
  };
  if (on_float32_copies(x) ||
      (is_half(x.dtype()) && !(float32_or_none(running_mean) && float32_or_none(running_var)))) {
    return batch_norm_widened(x, weight, bias, running_mean, running_var, training, momentum, eps);
  }
  const int64_t channels = x.size(1);
  check_affine("batch_norm", x, weight, "weight", channels);
  check_affine("batch_norm", x, bias, "bias", channels);
  check_running("batch_norm", x, running_mean, "running_mean", channels);
  check_running("batch_norm", x, running_var, "running_var", channels);
  if (!(eps > 0) || !(momentum >= 0 && momentum <= 1)) {
    throw ValueError(str_cat("[batch_norm] needs eps > 0 and momentum in [0, 1], got eps ", eps,
                             ", momentum ", momentum));
  }
  if (running_mean.defined() != running_var.defined()) {
    throw ValueError(str_cat("[batch_norm] needs both running statistics or neither, got only ",
                             running_mean.defined() ? "running_mean" : "running_var"));
  }
  if (!training && !(running_mean.defined() && running_var.defined())) {
    throw ValueError("[batch_norm] evaluation needs the running mean and variance");
  }
  const Tensor xs = as_ncs(x);
  if (training && xs.size(0) * xs.size(2) < 2) {
    throw ValueError(str_cat("[batch_norm] training needs more than one value per channel, got ",
                             "input shape ", shape_str(x.shape())));
  }
  Tensor out = Tensor::empty(xs.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({channels}, compute_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({channels}, compute_dtype(x.dtype()), x.device());
  const Tensor w = weight.defined() ? weight.view({channels}) : Tensor();
  const Tensor b = bias.defined() ? bias.view({channels}) : Tensor();
  Tensor rm = running_mean.defined() ? running_mean.view({channels}) : Tensor();
  Tensor rv = running_var.defined() ? running_var.view({channels}) : Tensor();
  const double m = training && rm.defined() ? momentum : -1.0;
  if (x.numel() > 0) {
    backend_for(x.device()).batch_norm(xs, eps, m, !training, w, b, rm, rv, out, mean, rstd);
  }
  if (training && rm.defined()) {
    running_mean.mark_modified();
    running_var.mark_modified();
  }
  out = out.view(x.shape());
  if (should_record({&x, &weight, &bias})) {
    auto node = std::make_unique<BatchNormBackward>();
    node->x = node->save(xs);
    node->mean = mean;
    node->rstd = rstd;
    node->weight = w.defined() ? node->save(w) : Tensor();
    node->use_running = !training;
    node->input_shape = x.shape();
    node->weight_shape = weight.defined() ? weight.shape() : Shape{};
    node->bias_shape = bias.defined() ? bias.shape() : Shape{};
    record(std::move(node), {&x, &weight, &bias}, out);
  }
  return out;
}

Tensor dropout(const Tensor& x, const DropoutKey& key, const Tensor& samples) {
  check::floating("dropout", "input", x);
  if (!(key.p >= 0 && key.p < 1)) {
    throw ValueError(str_cat("[dropout] p must be in [0, 1), got ", key.p));
  }
  if (x.dim() < 1 || !samples.defined() || samples.dtype() != DType::kInt32 || samples.dim() != 1 ||
      samples.size(0) != x.size(0)) {
    throw ShapeError(str_cat("[dropout] needs one int32 sample index per row of ", x.describe(),
                             ", got ", samples.describe()));
  }
  check::same_device("dropout", x, samples);
  if (key.p == 0) return x;
  if (graph_capturing(x.device())) {
    // The mask's key (the optimizer step) is an argument of the kernel: a replay would repeat it.
    throw NotCapturable(
        "[dropout] cannot be captured in a CUDA graph: its mask is keyed by the step, which a "
        "replay would freeze (--cuda-graphs off runs it eagerly)");
  }
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_for(x.device()).dropout(x, key, samples, out);
  if (should_record({&x})) {
    auto node = std::make_unique<DropoutBackward>();
    node->key = key;
    node->samples = node->save(samples);  // an in-place change before backward is refused
    record(std::move(node), {&x}, out);
  }
  return out;
}

}  // namespace accrue
