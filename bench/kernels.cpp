// Kernel benchmarks on every device present, each reporting bytes/s (or FLOP/s) and `roofline`,
// the fraction of the same-run limit (limits.cpp): for bandwidth-bound kernels a copy touching
// the same memory footprint. The bytes a kernel must move per element are stated at each
// benchmark (the footprint is the distinct memory it touches); float32 unless a name says bf16
// (mixed precision: the GEMMs on bfloat16 operands beside their float32 twins, the Adam pass
// that also writes the bfloat16 working copy).
#include <optional>

#include "common.h"
#include "kernels/backend.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/onednn.h"

namespace accrue::bench {

namespace {

using benchmark::State;

std::vector<int64_t> sizes(Device device) {
  if (smoke()) return {10000};
  std::vector<int64_t> s{10000, 100000, 1000000, 10000000};
  if (device.is_cuda()) {
    s.push_back(int64_t(1) << 24);  // the >= 16M-parameter target
    s.push_back(100000000);
  }
  return s;
}

// grad += dgrad * s: read dgrad, read grad, write grad = 12 bytes per element.
void accumulate(State& state, Device d) {
  const int64_t n = state.range(0);
  Tensor g = filled({n}, d, 1), dg = filled({n}, d, 2);
  const double seconds = run_timed(state, d, [&] { backend_for(d).axpy(0.25, dg, g); });
  report_bytes(state, d, seconds, 12.0 * n, 8.0 * n);
}

// Global norm: read g = 4 bytes per element.
void global_norm(State& state, Device d) {
  const int64_t n = state.range(0);
  Tensor g = filled({n}, d), out = Tensor::zeros({2}, DType::kFloat32, d);
  const double seconds = run_timed(state, d, [&] { backend_for(d).norm_sq(g, out); });
  report_bytes(state, d, seconds, 4.0 * n, 4.0 * n);
}

// A cast between float32 and bf16 (mixed precision's input batch and its logits): read one,
// write the other, 6 bytes per element.
void cast(State& state, Device d, DType from, DType to) {
  const int64_t n = state.range(0);
  Tensor src = to_dtype(filled({n}, d, 1), from), dst = Tensor::empty({n}, to, d);
  const double seconds = run_timed(state, d, [&] { backend_for(d).cast(src, dst); });
  report_bytes(state, d, seconds, 6.0 * n, 6.0 * n);
}

struct AdamState {
  Tensor p, g, m, v, norm_sq, boundary, steps, scaler, working;
  AdamState(int64_t n, Device d, bool with_working = false)
      : p(filled({n}, d, 1)),
        g(filled({n}, d, 2)),
        m(Tensor::zeros({n}, DType::kFloat32, d)),
        v(Tensor::zeros({n}, DType::kFloat32, d)),
        norm_sq(Tensor::zeros({2}, DType::kFloat32, d)),
        boundary(Tensor::from_vector<float>({4}, {1.0f, 1.0f, 0.0f, 1.0f}, d)),
        steps(Tensor::from_vector<int32_t>({1}, {1}, d)),
        working(with_working ? Tensor::zeros({n}, DType::kBFloat16, d) : Tensor()) {}
};

// Fused Adam / AdamW: read p, g, m, v and write p, g (zeroed), m, v = 32 bytes per element; with
// the bfloat16 working copy of mixed precision also write w = 34 bytes. The gradient the step
// zeroes is refilled before each timed step, as a backward would: with zero gradients m and v
// decay into subnormals within a thousand steps, and the pass would time subnormal arithmetic
// (0.05 of the copy bandwidth at 10^4 elements on a Xeon, against 1.0 at 10^7).
void adam(State& state, Device d, bool decoupled, bool with_working = false) {
  AdamState s(state.range(0), d, with_working);
  const AdamArgs hp{1e-3, 0.9, 0.999, 1e-8, decoupled ? 1e-2 : 0.0, decoupled};
  Backend& be = backend_for(d);
  const double seconds = run_timed_after(
      state, d, [&] { be.fill(s.g, 2.0); },
      [&] { be.adam_step(hp, s.boundary, s.steps, s.p, s.g, s.m, s.v, s.working); });
  const double bytes = with_working ? 34.0 : 32.0, footprint = with_working ? 18.0 : 16.0;
  report_bytes(state, d, seconds, bytes * state.range(0), footprint * state.range(0));
}

// The whole boundary step: norm (4 B) + boundary scalars + fused Adam (32 B) = 36 bytes/element;
// the gradient refilled before each step, as in adam.
void boundary_step(State& state, Device d) {
  AdamState s(state.range(0), d);
  const AdamArgs hp{1e-3, 0.9, 0.999, 1e-8, 0.0, false};
  Backend& be = backend_for(d);
  const double seconds = run_timed_after(
      state, d, [&] { be.fill(s.g, 2.0); },
      [&] {
        be.norm_sq(s.g, s.norm_sq);
        be.boundary(s.norm_sq, 1.0, 1.0, {}, s.scaler, s.boundary, s.steps);
        be.adam_step(hp, s.boundary, s.steps, s.p, s.g, s.m, s.v, s.working);
      });
  report_bytes(state, d, seconds, 36.0 * state.range(0), 16.0 * state.range(0));
}

// Softmax cross-entropy forward + backward over [rows, classes]: forward reads logits and
// writes probs, backward reads probs and writes dlogits = 16 bytes per element.
void softmax_ce(State& state, Device d) {
  const int64_t rows = state.range(0), cols = state.range(1);
  Tensor logits = filled({rows, cols}, d), probs = Tensor::empty({rows, cols}, DType::kFloat32, d);
  Tensor dlogits = Tensor::empty({rows, cols}, DType::kFloat32, d);
  std::vector<int32_t> l(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) l[i] = static_cast<int32_t>(i % cols);
  Tensor labels = Tensor::from_vector<int32_t>({rows}, l, d);
  Tensor loss = Tensor::zeros({}, DType::kFloat32, d), seed = full({}, 1.0, DType::kFloat32, d);
  Backend& be = backend_for(d);
  const double seconds = run_timed(state, d, [&] {
    be.cross_entropy(logits, labels, loss, probs);
    be.cross_entropy_backward(probs, labels, seed, dlogits);
  });
  report_bytes(state, d, seconds, 16.0 * rows * cols, 12.0 * rows * cols);
}

// An activation's forward (ReLU, tanh, GELU): read x, write y = 2 elements' bytes each.
void activation_forward(State& state, Device d, UnaryOp op, DType dtype = DType::kFloat32) {
  const int64_t n = state.range(0);
  Tensor x = to_dtype(filled({n}, d), dtype), y = Tensor::empty({n}, dtype, d);
  const double seconds = run_timed(state, d, [&] { backend_for(d).unary(op, x, y); });
  const double bytes = 2.0 * double(dtype_size(dtype)) * double(n);
  report_bytes(state, d, seconds, bytes, bytes);
}

// Its backward: read what the forward saved and dy, write dx = 3 elements' bytes each.
void activation_backward(State& state, Device d, UnaryOp op, DType dtype = DType::kFloat32) {
  const int64_t n = state.range(0);
  Tensor x = to_dtype(filled({n}, d, 1), dtype), dy = to_dtype(filled({n}, d, 2), dtype);
  Tensor dx = Tensor::empty({n}, dtype, d);
  const double seconds = run_timed(state, d, [&] { backend_for(d).unary_backward(op, x, dy, dx); });
  const double bytes = 3.0 * double(dtype_size(dtype)) * double(n);
  report_bytes(state, d, seconds, bytes, bytes);
}

// A Linear's bias gradient, dbias [C] += the column sums of dy [rows, C] (read dy, read and
// write dbias); with relu, the fused Linear + ReLU backward's half: dz = dy where y > 0 as well
// (read y and dy, write dz).
void bias_gradient(State& state, Device d, bool relu) {
  const int64_t rows = state.range(0), cols = state.range(1);
  Tensor y = filled({rows, cols}, d, 1), dy = filled({rows, cols}, d, 2);
  Tensor dz = Tensor::empty({rows, cols}, DType::kFloat32, d);
  Tensor dbias = Tensor::zeros({cols}, DType::kFloat32, d);
  Backend& be = backend_for(d);
  const double seconds = run_timed(state, d, [&] {
    if (relu) be.relu_bias_backward(y, dy, dz, 1.0, dbias);
    if (!relu) be.sum_rows(dy, 1.0, 1.0, dbias);
  });
  const double bytes = 4.0 * double(rows * cols) * (relu ? 3 : 1) + 8.0 * double(cols);
  report_bytes(state, d, seconds, bytes, bytes);
}

// Linear forward GEMM: y [b, out] = x [b, in] @ W [out, in]^T; 2 * b * in * out FLOP. In
// `dtype` throughout (bf16: float32 accumulation, y rounded to bf16).
void gemm_forward(State& state, Device d, DType dtype = DType::kFloat32) {
  const int64_t b = state.range(0), in = state.range(1), out = state.range(2);
  Tensor x = to_dtype(filled({b, in}, d, 1), dtype), w = to_dtype(filled({out, in}, d, 2), dtype),
         y = Tensor::empty({b, out}, dtype, d);
  const double seconds =
      run_timed(state, d, [&] { backend_for(d).gemm(false, true, 1.0, x, w, 0.0, y); });
  report_flops(state, d, seconds, 2.0 * b * in * out);
}

// Weight-gradient GEMM into the arena: dW [out, in] += dy [b, out]^T @ x [b, in], beta = 1.
// dW is float32 whatever `dtype` the operands are in (mixed precision's arena).
void gemm_weight_grad(State& state, Device d, DType dtype = DType::kFloat32) {
  const int64_t b = state.range(0), in = state.range(1), out = state.range(2);
  Tensor x = to_dtype(filled({b, in}, d, 1), dtype), dy = to_dtype(filled({b, out}, d, 2), dtype),
         dw = Tensor::zeros({out, in}, DType::kFloat32, d);
  const double seconds =
      run_timed(state, d, [&] { backend_for(d).gemm(true, false, 1.0, dy, x, 1.0, dw); });
  report_flops(state, d, seconds, 2.0 * b * in * out);
}

// The bf16 forward GEMM as one oneDNN matmul that threads itself over the whole product, the
// reference for accrue's cut with one single-threaded matmul per block (gemm_forward_bf16 where
// bfloat16 products go to oneDNN: kernels/cpu/bf16_products.h). CPU only.
void gemm_forward_bf16_onednn_threaded(State& state, Device d) {
  const int64_t b = state.range(0), in = state.range(1), out = state.range(2);
  Tensor x = to_dtype(filled({b, in}, d, 1), DType::kBFloat16),
         w = to_dtype(filled({out, in}, d, 2), DType::kBFloat16),
         y = Tensor::empty({b, out}, DType::kFloat32, d);
  const double seconds = run_timed(state, d, [&] {
    cpu::onednn_bf16_gemm(false, true, int(b), int(out), int(in), 1.0f, x.data<bf16>(), int(in),
                          w.data<bf16>(), int(in), 0.0f, y.data<float>(), int(out));
  });
  report_flops(state, d, seconds, 2.0 * b * in * out);
}

// Data-gradient GEMM: dx [b, in] = dy [b, out] @ W [out, in]; the MLP's hidden layers' (the first
// layer's is never computed: its input needs no gradient).
void gemm_data_grad(State& state, Device d) {
  const int64_t b = state.range(0), in = state.range(1), out = state.range(2);
  Tensor dy = filled({b, out}, d, 1), w = filled({out, in}, d, 2),
         dx = Tensor::empty({b, in}, DType::kFloat32, d);
  const double seconds =
      run_timed(state, d, [&] { backend_for(d).gemm(false, false, 1.0, dy, w, 0.0, dx); });
  report_flops(state, d, seconds, 2.0 * b * in * out);
}

// Convolution, NCHW, 3 x 3, padding 1: {batch, in channels, out channels, size}. 2 N O OH OW C
// KH KW FLOP per pass (forward, backward-data, backward-filter alike), whatever the algorithm:
// Winograd's GFLOP/s are those of the direct convolution it stands for. A one-channel convolution
// (conv1: 18 FLOP per output value, memory-bound) also reports the bytes it must move, the
// tensors it reads and writes once, and its roofline is the fraction of the same-run copy
// bandwidth. On the CPU, `forced` runs one algorithm where it applies (else the backend's choice).
// In bf16 (mixed precision: the CPU's conv_half.cpp) the filter and bias gradients go into float32
// buffers, as into the gradient arena.
using cpu::ConvPass;
void conv(State& state, Device d, ConvPass pass,
          std::optional<cpu::ConvAlgorithm> forced = std::nullopt, DType dtype = DType::kFloat32) {
  std::optional<cpu::ForcedConvAlgorithm> force;
  if (forced) force.emplace(*forced);
  const int64_t n = state.range(0), c = state.range(1), o = state.range(2), hw = state.range(3);
  const Conv2dGeometry g{1, 1, 1, 1, 1, 1};
  const auto make = [&](const Shape& shape, uint64_t seed) {
    return to_dtype(filled(shape, d, seed), dtype);
  };
  Tensor x = make({n, c, hw, hw}, 1), w = make({o, c, 3, 3}, 2), b = make({o}, 3);
  Tensor y = make({n, o, hw, hw}, 4), dx = Tensor::empty({n, c, hw, hw}, dtype, d);
  Tensor dw = Tensor::zeros({o, c, 3, 3}, DType::kFloat32, d),
         db = Tensor::zeros({o}, DType::kFloat32, d);
  Backend& be = backend_for(d);
  const double seconds = run_timed(state, d, [&] {
    if (pass == ConvPass::kForward) be.conv2d_forward(x, w, b, g, y);
    if (pass == ConvPass::kBackwardData) be.conv2d_backward_data(y, w, g, dx);
    if (pass == ConvPass::kBackwardFilter) be.conv2d_backward_filter(y, x, g, 1.0, dw, db);
  });
  report_flops(state, d, seconds, 2.0 * n * o * hw * hw * c * 9);
  if (c == 1) {
    const double weights = double(w.numel() + b.numel()), images = double(x.numel());
    const double outputs = double(y.numel());  // y or dy
    const double element = double(dtype_size(dtype));
    const double bytes = element * (outputs + images) +
                         (pass == ConvPass::kBackwardFilter
                              ? 2.0 * 4.0 * weights  // dw, db (float32) read and written
                              : element * weights);
    report_bytes(state, d, seconds, bytes, bytes);
  }
}

// The CNN's other kernels at its micro-batch shapes {batch, channels, size}, in bytes against the
// same-run copy bandwidth: what each must read and write at least (the input once, the output
// once; the backward passes also read what they were given).
// max_pool2d_relu is the CNN's (the ReLU before the pooling applied per tap); the _bf16 rows its
// mixed-precision form.
void max_pool(State& state, Device d, bool backward, bool relu, DType dtype = DType::kFloat32) {
  const int64_t n = state.range(0), c = state.range(1), hw = state.range(2);
  const Pool2dGeometry g{2, 2, 2, 2, 0, 0};
  Tensor x = to_dtype(filled({n, c, hw, hw}, d, 1), dtype);
  Tensor y = to_dtype(filled({n, c, hw / 2, hw / 2}, d, 2), dtype);
  Tensor at = Tensor::empty(y.shape(), DType::kInt32, d);
  Backend& be = backend_for(d);
  be.max_pool2d(x, g, relu, y, at);
  const double seconds = run_timed(state, d, [&] {
    if (backward) be.max_pool2d_backward(y, at, x);
    if (!backward) be.max_pool2d(x, g, relu, y, at);
  });
  // x or dx, y and argmax or dy and argmax
  const double element = double(dtype_size(dtype));
  const double bytes = element * double(x.numel()) + (element + 4.0) * double(y.numel());
  report_bytes(state, d, seconds, bytes, bytes);
}

// Group norm of x [N, C, S] with its affine gradients. In bf16 as mixed precision runs it: x, y,
// dy, the weight and bias in bf16; the statistics and the affine gradients (the arena) in float32.
void norm_groups(State& state, Device d, bool backward, int64_t n, int64_t c, int64_t s,
                 int64_t groups, DType dtype = DType::kFloat32) {
  Tensor x = to_dtype(filled({n, c, s}, d, 1), dtype),
         dy = to_dtype(filled({n, c, s}, d, 2), dtype);
  Tensor w = to_dtype(filled({c}, d, 3), dtype), b = to_dtype(filled({c}, d, 4), dtype);
  Tensor y = Tensor::empty(x.shape(), dtype, d);
  Tensor mean = Tensor::empty({n, groups}, compute_dtype(dtype), d), rstd = mean.clone();
  Tensor dw = Tensor::zeros({c}, compute_dtype(dtype), d), db = dw.clone();
  Backend& be = backend_for(d);
  be.group_norm(x, groups, 1e-5, w, b, y, mean, rstd);
  const double seconds = run_timed(state, d, [&] {
    if (backward) be.group_norm_backward(dy, x, groups, mean, rstd, w, y, 1.0, dw, db);
    if (!backward) be.group_norm(x, groups, 1e-5, w, b, y, mean, rstd);
  });
  // x (and dy) in, y or dx out
  const double bytes = double(dtype_size(dtype)) * double(x.numel()) * (backward ? 3 : 2);
  report_bytes(state, d, seconds, bytes, bytes);
}

// The CNN's group norm: {batch, channels, size}, 8 groups of the size x size planes.
void group_norm(State& state, Device d, bool backward) {
  const int64_t hw = state.range(2);
  norm_groups(state, d, backward, state.range(0), state.range(1), hw * hw, 8);
}

// The transformer's layer norm: {rows, features}, each row one group (as nn::LayerNorm runs it).
void layer_norm(State& state, Device d, bool backward, DType dtype = DType::kFloat32) {
  norm_groups(state, d, backward, state.range(0), state.range(1), 1, 1, dtype);
}

// Batch norm in training (the batch's statistics, the running ones updated; its backward with the
// affine gradients), as the BatchNorm CNN runs it after each convolution.
void batch_norm(State& state, Device d, bool backward) {
  const int64_t n = state.range(0), c = state.range(1), hw = state.range(2);
  Tensor x = filled({n, c, hw * hw}, d, 1), dy = filled({n, c, hw * hw}, d, 2);
  Tensor w = filled({c}, d, 3), b = filled({c}, d, 4), y = Tensor::empty(x.shape(), x.dtype(), d);
  Tensor running_mean = Tensor::zeros({c}, x.dtype(), d), running_var = filled({c}, d, 5);
  Tensor mean = Tensor::empty({c}, x.dtype(), d), rstd = mean.clone();
  Tensor dw = Tensor::zeros({c}, x.dtype(), d), db = dw.clone();
  Backend& be = backend_for(d);
  be.batch_norm(x, 1e-5, 0.1, false, w, b, running_mean, running_var, y, mean, rstd);
  const double seconds = run_timed(state, d, [&] {
    if (backward) be.batch_norm_backward(dy, x, false, mean, rstd, w, y, 1.0, dw, db);
    if (!backward)
      be.batch_norm(x, 1e-5, 0.1, false, w, b, running_mean, running_var, y, mean, rstd);
  });
  const double bytes = 4.0 * x.numel() * (backward ? 3 : 2);  // x (and dy) in, y or dx out
  report_bytes(state, d, seconds, bytes, bytes);
}

// The GroupNorm CNN's group norm, ReLU and 2x2 max pooling as one op: x in, the pooled y and its
// argmax out (backward: dy and argmax at the pooled size and x in, dx out).
void group_norm_relu_pool(State& state, Device d, bool backward) {
  const int64_t n = state.range(0), c = state.range(1), hw = state.range(2), groups = 8;
  const Pool2dGeometry g{2, 2, 2, 2, 0, 0};
  Tensor x = filled({n, c, hw, hw}, d, 1), dy = filled({n, c, hw / 2, hw / 2}, d, 2);
  Tensor w = filled({c}, d, 3), b = filled({c}, d, 4), y = Tensor::empty(dy.shape(), x.dtype(), d);
  Tensor at = Tensor::empty(dy.shape(), DType::kInt32, d),
         dx = Tensor::empty(x.shape(), x.dtype(), d);
  Tensor mean = Tensor::empty({n, groups}, x.dtype(), d), rstd = mean.clone();
  Tensor dw = Tensor::zeros({c}, x.dtype(), d), db = dw.clone();
  Backend& be = backend_for(d);
  be.group_norm_relu_max_pool2d(x, groups, 1e-5, w, b, g, y, at, mean, rstd);
  const double seconds = run_timed(state, d, [&] {
    if (backward) {
      be.group_norm_relu_max_pool2d_backward(dy, at, x, groups, mean, rstd, w, g, dx, 1.0, dw, db);
    } else {
      be.group_norm_relu_max_pool2d(x, groups, 1e-5, w, b, g, y, at, mean, rstd);
    }
  });
  const double bytes = 4.0 * x.numel() * (backward ? 2 : 1) + 8.0 * y.numel();
  report_bytes(state, d, seconds, bytes, bytes);
}

void dropout(State& state, Device d) {
  const int64_t n = state.range(0), c = state.range(1), hw = state.range(2);
  Tensor x = filled({n, c * hw * hw}, d, 1), y = Tensor::empty(x.shape(), x.dtype(), d);
  Tensor samples = Tensor::empty({n}, DType::kInt32, Device::cpu());
  for (int64_t i = 0; i < n; ++i) samples.data<int32_t>()[i] = static_cast<int32_t>(i);
  samples = samples.to(d);
  const double seconds = run_timed(state, d, [&] {
    backend_for(d).dropout(x, DropoutKey{0.5, 1, 1}, samples, y);
  });
  report_bytes(state, d, seconds, 8.0 * x.numel(), 8.0 * x.numel());
}

}  // namespace

void register_kernel_benchmarks() {
  for (Device d : bench_devices()) {
    const std::string dev = d.str();
    auto add = [&](const std::string& name, auto fn) {
      return benchmark::RegisterBenchmark((name + "/" + dev).c_str(), [=](State& s) { fn(s, d); })
          ->UseManualTime();
    };
    // An activation's forward and backward rows, name_forward<suffix> and name_backward<suffix>.
    const auto add_activation = [&](const char* name, UnaryOp op, DType t, const char* suffix,
                                    int64_t n) {
      add(str_cat(name, "_forward", suffix), [op, t](State& s, Device dd) {
        activation_forward(s, dd, op, t);
      })->Arg(n);
      add(str_cat(name, "_backward", suffix), [op, t](State& s, Device dd) {
        activation_backward(s, dd, op, t);
      })->Arg(n);
    };
    for (int64_t n : sizes(d)) {
      add("accumulate", accumulate)->Arg(n);
      add("global_norm", global_norm)->Arg(n);
      add("cast_to_bf16", [](State& s, Device dd) {
        cast(s, dd, DType::kFloat32, DType::kBFloat16);
      })->Arg(n);
      add("cast_from_bf16", [](State& s, Device dd) {
        cast(s, dd, DType::kBFloat16, DType::kFloat32);
      })->Arg(n);
      add("adam", [](State& s, Device dd) { adam(s, dd, false); })->Arg(n);
      add("adamw", [](State& s, Device dd) { adam(s, dd, true); })->Arg(n);
      add("boundary_step", boundary_step)->Arg(n);
      for (const auto& [name, op] : {std::pair<const char*, UnaryOp>{"relu", UnaryOp::kRelu},
                                     {"tanh", UnaryOp::kTanh},
                                     {"gelu", UnaryOp::kGelu}}) {
        add_activation(name, op, DType::kFloat32, "", n);
      }
      add("softmax_ce", softmax_ce)->Args({n / 1000 > 0 ? n / 1000 : 1, 1000});
    }
    if (!smoke()) {
      add("adam", [](State& s, Device dd) { adam(s, dd, false); })->Arg(567434);  // the MNIST MLP
      add("adam_bf16_copy", [](State& s, Device dd) { adam(s, dd, false, true); })->Arg(567434);
      add("adam_bf16_copy", [](State& s, Device dd) { adam(s, dd, false, true); })->Arg(10000000);
      add("boundary_step", boundary_step)->Arg(567434);
    }
    add("softmax_ce", softmax_ce)->Args({32, 10});  // MNIST micro-batch
    // G2P's LayerNorm: 32 words of about 32 positions, width 128
    add("layer_norm", [](State& s, Device dd) { layer_norm(s, dd, false); })->Args({1024, 128});
    add("layer_norm_backward", [](State& s, Device dd) {
      layer_norm(s, dd, true);
    })->Args({1024, 128});
    add("softmax_ce", softmax_ce)->Args({1000, 10});
    // G2P's activations in float32 and bf16: its MLP's GELU over about 640 positions x 512; the
    // bf16 layer norm (the CPU's 16-bit norm kernels; a device widens into float32 copies).
    for (const DType t : {DType::kFloat32, DType::kBFloat16}) {
      const char* suffix = t == DType::kBFloat16 ? "_bf16" : "_f32";
      add_activation("tanh", UnaryOp::kTanh, t, suffix, 640 * 512);
      add_activation("gelu", UnaryOp::kGelu, t, suffix, 640 * 512);
    }
    if (d.is_cpu()) {
      add("layer_norm_bf16", [](State& s, Device dd) {
        layer_norm(s, dd, false, DType::kBFloat16);
      })->Args({1024, 128});
      add("layer_norm_backward_bf16", [](State& s, Device dd) {
        layer_norm(s, dd, true, DType::kBFloat16);
      })->Args({1024, 128});
    }
    // Bias gradients {rows, columns}: G2P's Linear layers (about 600 positions a micro-batch,
    // width 128, its MLP 512 wide) and the MNIST MLP's first hidden layer at micro-batch 32.
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{640, 128}, {640, 512}, {32, 512}}) {
      add("sum_rows", [](State& s, Device dd) { bias_gradient(s, dd, false); })->Args(shape);
      add("relu_bias_backward", [](State& s, Device dd) {
        bias_gradient(s, dd, true);
      })->Args(shape);
    }
    // The MNIST MLP's layers at micro-batch 32: {batch, in, out}.
    const std::vector<std::vector<int64_t>> layers{
        {32, 784, 512}, {32, 512, 256}, {32, 256, 128}, {32, 128, 10}};
    const auto bf16 = [](auto fn) {
      return [fn](State& s, Device dd) { fn(s, dd, DType::kBFloat16); };
    };
    const auto f32 = [](auto fn) {
      return [fn](State& s, Device dd) { fn(s, dd, DType::kFloat32); };
    };
    for (const auto& l : layers) {
      add("gemm_forward", f32(gemm_forward))->Args(l);
      add("gemm_forward_bf16", bf16(gemm_forward))->Args(l);
      if (d.is_cpu() && cpu::onednn_bf16_available()) {
        add("gemm_forward_bf16_onednn_threaded", gemm_forward_bf16_onednn_threaded)->Args(l);
      }
      add("gemm_weight_grad", f32(gemm_weight_grad))->Args(l);
      add("gemm_weight_grad_bf16", bf16(gemm_weight_grad))->Args(l);
      if (l[1] != 784) add("gemm_data_grad", gemm_data_grad)->Args(l);
    }
    const int64_t big = smoke() ? 128 : (d.is_cpu() ? 1024 : 4096);
    add("gemm_forward", f32(gemm_forward))->Args({big, big, big});
    add("gemm_forward_bf16", bf16(gemm_forward))->Args({big, big, big});
    // The MNIST CNN's convolutions at micro-batch 32: conv1 (1 -> 32, 28 x 28), conv2 (32 -> 64,
    // 14 x 14). Not on a GPU of a build without cuDNN (conv_unavailable_reason says so).
    if (!conv_unavailable_reason(d).empty()) continue;
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{32, 1, 32, 28}, std::vector<int64_t>{32, 32, 64, 14}}) {
      for (const auto& [pass, name] :
           {std::pair<ConvPass, std::string>{ConvPass::kForward, "forward"},
            {ConvPass::kBackwardData, "backward_data"},
            {ConvPass::kBackwardFilter, "backward_filter"}}) {
        add("conv2d_" + name, [pass = pass](State& s, Device dd) {
          conv(s, dd, pass);
        })->Args(shape);
        if (!d.is_cpu()) continue;
        add("conv2d_" + name + "_bf16", [pass = pass](State& s, Device dd) {
          conv(s, dd, pass, std::nullopt, DType::kBFloat16);
        })->Args(shape);
        // The CPU's algorithms forced: Winograd for the forward and data passes, the direct
        // forward and filter gradient where the patch is small (conv1: one input channel, 3 x 3).
        const bool filter = pass == ConvPass::kBackwardFilter, conv1 = shape[1] == 1;
        if (filter && !conv1) continue;
        std::vector<cpu::ConvAlgorithm> algorithms{cpu::ConvAlgorithm::kIm2col};
        if (!filter) algorithms.push_back(cpu::ConvAlgorithm::kWinograd);
        if (conv1 && pass != ConvPass::kBackwardData)
          algorithms.push_back(cpu::ConvAlgorithm::kDirect);
        for (cpu::ConvAlgorithm algorithm : algorithms) {
          add(str_cat("conv2d_", name, "_", cpu::conv_algorithm_name(algorithm)),
              [pass = pass, algorithm](State& s, Device dd) { conv(s, dd, pass, algorithm); })
              ->Args(shape);
        }
      }
      // The layers after each convolution: {batch, its out channels, size}.
      const std::vector<int64_t> after{shape[0], shape[2], shape[3]};
      add("max_pool2d", [](State& s, Device dd) { max_pool(s, dd, false, false); })->Args(after);
      add("max_pool2d_relu", [](State& s, Device dd) {
        max_pool(s, dd, false, true);
      })->Args(after);
      add("max_pool2d_backward", [](State& s, Device dd) {
        max_pool(s, dd, true, false);
      })->Args(after);
      if (d.is_cpu()) {
        add("max_pool2d_relu_bf16", [](State& s, Device dd) {
          max_pool(s, dd, false, true, DType::kBFloat16);
        })->Args(after);
        add("max_pool2d_backward_bf16", [](State& s, Device dd) {
          max_pool(s, dd, true, false, DType::kBFloat16);
        })->Args(after);
      }
      add("group_norm", [](State& s, Device dd) { group_norm(s, dd, false); })->Args(after);
      add("group_norm_backward", [](State& s, Device dd) { group_norm(s, dd, true); })->Args(after);
      add("group_norm_relu_max_pool2d", [](State& s, Device dd) {
        group_norm_relu_pool(s, dd, false);
      })->Args(after);
      add("group_norm_relu_max_pool2d_backward", [](State& s, Device dd) {
        group_norm_relu_pool(s, dd, true);
      })->Args(after);
      add("batch_norm", [](State& s, Device dd) { batch_norm(s, dd, false); })->Args(after);
      add("batch_norm_backward", [](State& s, Device dd) { batch_norm(s, dd, true); })->Args(after);
      add("dropout", dropout)->Args(after);
    }
  }
}

}  // namespace accrue::bench
