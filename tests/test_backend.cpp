// The backend table: every primitive of kernels/backend.h, called directly, at sizes that reach
// the parallel CPU loops, several CUDA blocks and odd tails. Each row runs in float64 on the CPU
// (the reference), then in float32 on the CPU and in float32 and float64 on every other device,
// and every output is compared with the reference. The rows of the primitives that take 16-bit
// tensors run in bfloat16 and float16 too, against a float64 reference fed the same rounded
// inputs, with a tolerance of one unit in the last place of the format (the result's single
// rounding; the float32 arithmetic inside adds orders of magnitude less). A primitive without
// a row fails EveryPrimitiveHasARow, so a new primitive cannot land untested. The kernels' exact
// contracts (bits, orders, the library seam) are in test_backend_*.cpp, the same executable.
#include <set>

#include "kernels/backend.h"
#include "kernels/cpu/conv.h"
#include "kernels/trace.h"
#include "test_util.h"

namespace accrue::testing {
namespace {

using Outputs = std::vector<Tensor>;

constexpr int64_t kRows = 300, kCols = 1031;  // 309300 elements: parallel on CPU, multi-block
constexpr int64_t kFlat = 4 * 75000 + 3;      // a float4 tail

// Inputs of a row, identical values for every device and dtype (drawn in float64, rounded to
// `inputs` first: a 16-bit run and its float64 reference see the same values).
struct Maker {
  Device device;
  DType dtype;
  DType inputs = DType::kFloat64;
  Tensor uniform(const Shape& shape, uint64_t seed, double low = -1, double high = 1) const {
    return to_dtype(to_dtype(random(shape, seed, DType::kFloat64, low, high), inputs), dtype)
        .to(device);
  }
  Tensor values(const Shape& shape, std::vector<double> v) const {
    return to_dtype(to_dtype(Tensor::from_vector<double>(shape, v), inputs), dtype).to(device);
  }
  // The dtype an accumulating output takes: float32 under 16-bit inputs, else the row's own.
  DType wide_output() const { return is_half(dtype) ? DType::kFloat32 : dtype; }
  Tensor ints(std::vector<int32_t> v) const {
    return Tensor::from_vector<int32_t>({static_cast<int64_t>(v.size())}, v, device);
  }
  Tensor empty(const Shape& shape) const { return Tensor::empty(shape, dtype, device); }
  Backend& be() const { return backend_for(device); }
};

std::vector<int32_t> labels(int64_t n, int64_t classes) {
  std::vector<int32_t> l;
  for (int64_t i = 0; i < n; ++i) l.push_back(static_cast<int32_t>((i * 37 + 11) % classes));
  return l;
}

// Every fifth row ignored (fn::kIgnoreLabel): padding.
std::vector<int32_t> labels_with_ignored(int64_t n, int64_t classes) {
  std::vector<int32_t> l = labels(n, classes);
  for (size_t i = 0; i < l.size(); i += 5) l[i] = fn::kIgnoreLabel;
  return l;
}

// {norm, coef, skip, scale} as the boundary primitive would write them.
Tensor boundary_of(const Maker& m, double coef, bool skip) {
  return m.values({4}, {1.5, coef, skip ? 1.0 : 0.0, 1.0});
}

// Every registered element-wise op gets its rows from the same lists the backends use.
#define ACCRUE_TEST_UNARY_VALUE(functor, value) UnaryOp::value,
#define ACCRUE_TEST_BINARY_VALUE(functor, value) BinaryOp::value,

struct Row {
  std::string name;  // primitive, or primitive/variant
  std::function<Outputs(const Maker&)> run;
};

// The primitives that take bfloat16 and float16 tensors: their rows run in both. The norms take
// 16-bit x only beside float32 statistics (tests/test_norm.cpp checks them there), so their rows,
// all in the row's dtype, are refused by the statistics' dtype.
bool takes_half(const std::string& row) {
  static const std::set<std::string> primitives{"fill",
                                                "copy",
                                                "cast",
                                                "gather_rows",
                                                "permute",
                                                "axpy",
                                                "bias_add",
                                                "sum_rows",
                                                "sum_all",
                                                "expand_scalar",
                                                "linear_forward",
                                                "argmax",
                                                "unary",
                                                "unary_backward",
                                                "scale",
                                                "binary",
                                                "gemm",
                                                "gemm_batched",
                                                "relu_bias_backward",
                                                "conv2d_forward",
                                                "conv2d_backward_data",
                                                "conv2d_backward_filter",
                                                "max_pool2d",
                                                "max_pool2d_backward",
                                                "max_pool2d_relu",
                                                "max_pool2d_relu_backward",
                                                "avg_pool2d",
                                                "avg_pool2d_backward"};
  return primitives.count(row.substr(0, row.find('/'))) > 0;
}

// Of those, the ones whose 16-bit versions exist on the CPU alone (the CNN's convolution and
// pooling: mixed precision's matrix units are the CPU's subject here; the CUDA kernels take
// float32 and float64 and refuse 16 bits by name, checked below).
bool half_on_cpu_only(const std::string& row) {
  return row.rfind("conv2d", 0) == 0 || row.rfind("max_pool2d", 0) == 0 ||
         row.rfind("avg_pool2d", 0) == 0;
}

// A full reduction of n uniform values: sum_all, or norm_sq (the sum of squares and the count of
// non-finite entries).
Row full_reduction(const std::string& name, int64_t n) {
  const bool norm = name.rfind("norm_sq", 0) == 0;
  return {name, [=](const Maker& m) {
            Tensor out = m.empty({norm ? 2 : 1});
            if (norm) m.be().norm_sq(m.uniform({n}, 19), out);
            if (!norm) m.be().sum_all(m.uniform({n}, 10), out);
            return Outputs{out};
          }};
}

std::vector<Row> rows() {
  std::vector<Row> table{
      {"fill",
       [](const Maker& m) {
         Tensor out = m.empty({kFlat});
         m.be().fill(out, -1.25);
         return Outputs{out};
       }},
      {"copy",
       [](const Maker& m) {
         Tensor src = m.uniform({kFlat}, 1), dst = m.empty({kFlat});
         m.be().copy(src, dst);
         return Outputs{dst};
       }},
      {"cast/to_int32",
       [](const Maker& m) {
         // k + 0.5 casts to k in both precisions (no value sits near an integer boundary).
         std::vector<double> v;
         for (int64_t i = 0; i < 1000; ++i) v.push_back(static_cast<double>(i % 201 - 100) + 0.5);
         Tensor dst = Tensor::empty({1000}, DType::kInt32, m.device);
         m.be().cast(m.values({1000}, v), dst);
         return Outputs{dst};
       }},
      {"cast/to_int64",
       [](const Maker& m) {
         std::vector<double> v;
         for (int64_t i = 0; i < 1000; ++i) v.push_back(static_cast<double>(i % 201 - 100) + 0.5);
         Tensor dst = Tensor::empty({1000}, DType::kInt64, m.device);
         m.be().cast(m.values({1000}, v), dst);
         return Outputs{dst};
       }},
      {"cast/from_int64",
       [](const Maker& m) {
         // Integers of at most 7 bits: exact in every floating dtype.
         std::vector<int64_t> v;
         for (int64_t i = 0; i < 1000; ++i) v.push_back(i % 201 - 100);
         Tensor dst = m.empty({1000});
         m.be().cast(Tensor::from_vector<int64_t>({1000}, v, m.device), dst);
         return Outputs{dst};
       }},
      {"fill/int64",
       [](const Maker& m) {
         // Past 2^31: an int32 or float32 detour would show.
         Tensor out = Tensor::empty({kFlat}, DType::kInt64, m.device);
         m.be().fill(out, 4294967301.0);
         return Outputs{out};
       }},
      {"cast/to_float64",
       [](const Maker& m) {
         Tensor dst = Tensor::empty({kFlat}, DType::kFloat64, m.device);
         m.be().cast(m.uniform({kFlat}, 2), dst);
         return Outputs{dst};
       }},
      {"index_add_rows",
       [](const Maker& m) {
         Tensor out = m.uniform({kRows, kCols}, 41);
         m.be().index_add_rows(m.uniform({500, kCols}, 42), m.ints(labels(500, kRows)), out);
         return Outputs{out};
       }},
      {"gather_rows",
       [](const Maker& m) {
         Tensor out = m.empty({500, kCols});
         m.be().gather_rows(m.uniform({kRows, kCols}, 3), m.ints(labels(500, kRows)), out);
         return Outputs{out};
       }},
      {"permute/head_split",  // [B, T, 3, H, D] -> [3, B, H, T, D]: runs of D
       [](const Maker& m) {
         Tensor out = m.empty({3, 5, 4, 37, 24});
         m.be().permute(m.uniform({5, 37, 3, 4, 24}, 46), {2, 0, 3, 1, 4}, out);
         return Outputs{out};
       }},
      {"permute/transpose",  // the last dimension moves: element by element
       [](const Maker& m) {
         Tensor out = m.empty({kCols, kRows});
         m.be().permute(m.uniform({kRows, kCols}, 47), {1, 0}, out);
         return Outputs{out};
       }},
      {"axpy",
       [](const Maker& m) {
         Tensor y = m.uniform({kFlat}, 5);
         m.be().axpy(-0.75, m.uniform({kFlat}, 4), y);
         return Outputs{y};
       }},
      {"axpy/into_float32",
       [](const Maker& m) {
         Tensor y = to_dtype(random({kFlat}, 5), m.wide_output()).to(m.device);
         m.be().axpy(-0.75, m.uniform({kFlat}, 4), y);
         return Outputs{y};
       }},
      {"cast/to_half",
       [](const Maker& m) {
         // float32 and float64 into both 16-bit formats, and back
         Outputs out;
         for (DType half : {DType::kBFloat16, DType::kFloat16}) {
           Tensor dst = Tensor::empty({kFlat}, half, m.device);
           m.be().cast(m.uniform({kFlat}, 2, -60000, 60000), dst);
           Tensor back = m.empty({kFlat});
           m.be().cast(dst, back);
           out.push_back(back);
         }
         return out;
       }},
      {"bias_add",
       [](const Maker& m) {
         Tensor y = m.empty({kRows, kCols});
         m.be().bias_add(m.uniform({kRows, kCols}, 6), m.uniform({kCols}, 7), y);
         return Outputs{y};
       }},
      {"sum_rows/write",
       [](const Maker& m) {
         Tensor out = m.empty({kCols});
         m.be().sum_rows(m.uniform({kRows, kCols}, 8), 0.5, 0.0, out);
         return Outputs{out};
       }},
      {"sum_rows/accumulate",
       [](const Maker& m) {
         Tensor out = m.uniform({kCols}, 9);
         m.be().sum_rows(m.uniform({kRows, kCols}, 8), 1.0, 1.0, out);
         return Outputs{out};
       }},
      {"sum_rows/into_float32",
       [](const Maker& m) {
         Tensor out = to_dtype(random({kCols}, 9), m.wide_output()).to(m.device);
         m.be().sum_rows(m.uniform({kRows, kCols}, 8), 1.0, 1.0, out);
         return Outputs{out};
       }},
      {"relu_bias_backward/into_float32",
       [](const Maker& m) {
         Tensor dz = m.empty({kRows, kCols});
         Tensor dbias = to_dtype(random({kCols}, 10), m.wide_output()).to(m.device);
         m.be().relu_bias_backward(m.uniform({kRows, kCols}, 8), m.uniform({kRows, kCols}, 9), dz,
                                   1.0, dbias);
         return Outputs{dz, dbias};
       }},
      {"relu_bias_backward/write",
       [](const Maker& m) {
         Tensor dz = m.empty({kRows, kCols}), dbias = m.empty({kCols});
         m.be().relu_bias_backward(m.uniform({kRows, kCols}, 8), m.uniform({kRows, kCols}, 9), dz,
                                   0.0, dbias);
         return Outputs{dz, dbias};
       }},
      {"relu_bias_backward/accumulate",
       [](const Maker& m) {
         Tensor dz = m.empty({kRows, kCols}), dbias = m.uniform({kCols}, 10);
         m.be().relu_bias_backward(m.uniform({kRows, kCols}, 8), m.uniform({kRows, kCols}, 9), dz,
                                   1.0, dbias);
         return Outputs{dz, dbias};
       }},
      // fewer rows than the CUDA column sums' row slices (some slices empty), and a lone column
      {"sum_rows/few_rows",
       [](const Maker& m) {
         Tensor out = m.uniform({37}, 9);
         m.be().sum_rows(m.uniform({5, 37}, 8), 1.0, 1.0, out);
         return Outputs{out};
       }},
      {"relu_bias_backward/few_rows_one_column",
       [](const Maker& m) {
         Tensor dz = m.empty({3, 1}), dbias = m.uniform({1}, 10);
         m.be().relu_bias_backward(m.uniform({3, 1}, 8), m.uniform({3, 1}, 9), dz, 1.0, dbias);
         return Outputs{dz, dbias};
       }},
      {"relu_bias_backward/no_bias",
       [](const Maker& m) {
         Tensor dz = m.empty({kRows, kCols}), none;
         m.be().relu_bias_backward(m.uniform({kRows, kCols}, 8), m.uniform({kRows, kCols}, 9), dz,
                                   0.0, none);
         return Outputs{dz};
       }},
      full_reduction("sum_all", kFlat),
      // small enough for CUDA's one-block reduction (a micro-step's loss over its rows), and at
      // its limit
      full_reduction("sum_all/small", 37),
      full_reduction("sum_all/one_block_limit", 64 * 256),
      full_reduction("norm_sq/small", 1000),
      {"expand_scalar",
       [](const Maker& m) {
         Tensor out = m.empty({kFlat});
         m.be().expand_scalar(m.values({1}, {0.3}), -2.0, out);
         return Outputs{out};
       }},
      {"linear_forward/bias",
       [](const Maker& m) {
         Tensor y = m.empty({kRows, 40});
         m.be().linear_forward(m.uniform({kRows, kCols}, 11), m.uniform({40, kCols}, 12),
                               m.uniform({40}, 13), false, y);
         return Outputs{y};
       }},
      {"linear_forward/bias_relu",
       [](const Maker& m) {
         Tensor y = m.empty({kRows, 40});
         m.be().linear_forward(m.uniform({kRows, kCols}, 11), m.uniform({40, kCols}, 12),
                               m.uniform({40}, 13), true, y);
         return Outputs{y};
       }},
      {"linear_forward/relu_no_bias",
       [](const Maker& m) {
         Tensor y = m.empty({kRows, 40});
         m.be().linear_forward(m.uniform({kRows, kCols}, 11), m.uniform({40, kCols}, 12), Tensor(),
                               true, y);
         return Outputs{y};
       }},
      {"linear_forward/no_bias",
       [](const Maker& m) {
         Tensor y = m.empty({kRows, 40});
         m.be().linear_forward(m.uniform({kRows, kCols}, 11), m.uniform({40, kCols}, 12), Tensor(),
                               false, y);
         return Outputs{y};
       }},
      {"log_softmax",
       [](const Maker& m) {
         Tensor y = m.empty({kRows, kCols});
         m.be().log_softmax(m.uniform({kRows, kCols}, 14, -5, 5), y);
         return Outputs{y};
       }},
      {"log_softmax_backward",
       [](const Maker& m) {
         Tensor y = m.empty({kRows, kCols}), dx = m.empty({kRows, kCols});
         m.be().log_softmax(m.uniform({kRows, kCols}, 14, -5, 5), y);
         m.be().log_softmax_backward(y, m.uniform({kRows, kCols}, 15), dx);
         return Outputs{dx};
       }},
      {"cross_entropy",
       [](const Maker& m) {
         Tensor loss = m.empty({}), probs = m.empty({kRows, kCols});
         m.be().cross_entropy(m.uniform({kRows, kCols}, 16, -5, 5), m.ints(labels(kRows, kCols)),
                              loss, probs);
         return Outputs{loss, probs};
       }},
      {"cross_entropy_ignoring",
       [](const Maker& m) {
         Tensor loss = m.empty({}), probs = m.empty({kRows, kCols});
         m.be().cross_entropy(m.uniform({kRows, kCols}, 16, -5, 5),
                              m.ints(labels_with_ignored(kRows, kCols)), loss, probs);
         return Outputs{loss, probs};
       }},
      // At most kThreads rows: one CUDA launch sums the rows' losses too (a micro-batch's loss).
      {"cross_entropy/micro_batch",
       [](const Maker& m) {
         Tensor loss = m.empty({}), probs = m.empty({32, 10});
         m.be().cross_entropy(m.uniform({32, 10}, 16, -5, 5), m.ints(labels(32, 10)), loss, probs);
         return Outputs{loss, probs};
       }},
      {"cross_entropy/one_block_limit",
       [](const Maker& m) {
         Tensor loss = m.empty({}), probs = m.empty({256, 37});
         m.be().cross_entropy(m.uniform({256, 37}, 16, -5, 5), m.ints(labels_with_ignored(256, 37)),
                              loss, probs);
         return Outputs{loss, probs};
       }},
      // Few rows of many classes: more than one block's worth of logits takes the launch per row.
      {"cross_entropy/wide_rows",
       [](const Maker& m) {
         Tensor loss = m.empty({}), probs = m.empty({40, 2000});
         m.be().cross_entropy(m.uniform({40, 2000}, 16, -5, 5),
                              m.ints(labels_with_ignored(40, 2000)), loss, probs);
         return Outputs{loss, probs};
       }},
      {"cross_entropy_backward_ignoring",
       [](const Maker& m) {
         Tensor dlogits = m.empty({kRows, kCols});
         m.be().cross_entropy_backward(m.uniform({kRows, kCols}, 17, 0, 1),
                                       m.ints(labels_with_ignored(kRows, kCols)),
                                       m.values({}, {0.25}), dlogits);
         return Outputs{dlogits};
       }},
      {"cross_entropy_backward",
       [](const Maker& m) {
         Tensor dlogits = m.empty({kRows, kCols});
         m.be().cross_entropy_backward(m.uniform({kRows, kCols}, 17, 0, 1),
                                       m.ints(labels(kRows, kCols)), m.values({}, {0.25}), dlogits);
         return Outputs{dlogits};
       }},
      {"causal_softmax",
       [](const Maker& m) {
         Tensor y = m.empty({3, kCols, kCols});
         m.be().causal_softmax(0.7, m.uniform({3, kCols, kCols}, 43, -5, 5), y);
         return Outputs{y};
       }},
      {"causal_softmax_after_cached_keys",  // 3 queries, the last of kCols positions
       [](const Maker& m) {
         Tensor y = m.empty({2, 3, kCols});
         m.be().causal_softmax(0.7, m.uniform({2, 3, kCols}, 46, -5, 5), y);
         return Outputs{y};
       }},
      {"causal_softmax_backward",
       [](const Maker& m) {
         Tensor y = m.empty({3, kCols, kCols}), dx = m.empty({3, kCols, kCols});
         m.be().causal_softmax(0.7, m.uniform({3, kCols, kCols}, 44, -5, 5), y);
         m.be().causal_softmax_backward(0.7, y, m.uniform({3, kCols, kCols}, 45), dx);
         return Outputs{dx};
       }},
      {"argmax",
       [](const Maker& m) {
         Tensor index = Tensor::empty({kRows}, DType::kInt32, m.device);
         m.be().argmax(m.uniform({kRows, kCols}, 18), index);
         return Outputs{index};
       }},
      {"count_equal",
       [](const Maker& m) {
         Tensor out = Tensor::empty({1}, DType::kInt32, m.device);
         m.be().count_equal(m.ints(labels(kFlat, 7)), m.ints(labels(kFlat, 5)), out);
         return Outputs{out};
       }},
      full_reduction("norm_sq/finite", kFlat),
      {"norm_sq/non_finite",
       [](const Maker& m) {
         Tensor g = m.uniform({kFlat}, 19).to(Device::cpu());
         Tensor host = to_dtype(g, DType::kFloat64);
         host.data<double>()[7] = NAN;
         host.data<double>()[kFlat - 1] = INFINITY;
         Tensor out = m.empty({2});
         m.be().norm_sq(to_dtype(host, m.dtype).to(m.device), out);
         return Outputs{out.narrow(1, 1)};  // the count; the sum is NaN by design
       }},
  };
  // Convolution, pooling, normalisation, dropout: shapes past the CPU's parallel grain and
  // several CUDA blocks, odd sizes everywhere.
  const Conv2dGeometry same{1, 1, 1, 1, 1, 1}, strided{2, 2, 2, 2, 2, 2};
  for (const auto& [name, g] :
       {std::pair<std::string, Conv2dGeometry>{"same", same},
        std::pair<std::string, Conv2dGeometry>{"strided_dilated", strided}}) {
    const int64_t oh = conv2d_out_size(20, 3, g.stride_h, g.pad_h, g.dilation_h);
    const int64_t ow = conv2d_out_size(23, 3, g.stride_w, g.pad_w, g.dilation_w);
    table.push_back({"conv2d_forward/" + name, [=](const Maker& m) {
                       Tensor y = m.empty({3, 7, oh, ow});
                       m.be().conv2d_forward(m.uniform({3, 5, 20, 23}, 40),
                                             m.uniform({7, 5, 3, 3}, 41), m.uniform({7}, 42), g, y);
                       return Outputs{y};
                     }});
    table.push_back({"conv2d_forward/" + name + "_no_bias", [=](const Maker& m) {
                       Tensor y = m.empty({3, 7, oh, ow});
                       m.be().conv2d_forward(m.uniform({3, 5, 20, 23}, 40),
                                             m.uniform({7, 5, 3, 3}, 41), Tensor(), g, y);
                       return Outputs{y};
                     }});
    table.push_back({"conv2d_backward_data/" + name, [=](const Maker& m) {
                       Tensor dx = m.empty({3, 5, 20, 23});
                       m.be().conv2d_backward_data(m.uniform({3, 7, oh, ow}, 43),
                                                   m.uniform({7, 5, 3, 3}, 41), g, dx);
                       return Outputs{dx};
                     }});
    for (double beta : {0.0, 1.0}) {
      table.push_back(
          {str_cat("conv2d_backward_filter/", name, beta == 0 ? "_write" : "_accumulate"),
           [=](const Maker& m) {
             Tensor dw = m.uniform({7, 5, 3, 3}, 44), db = m.uniform({7}, 45);
             m.be().conv2d_backward_filter(m.uniform({3, 7, oh, ow}, 43),
                                           m.uniform({3, 5, 20, 23}, 40), g, beta, dw, db);
             return Outputs{dw, db};
           }});
    }
    // into the gradient arena: float32 under 16-bit inputs (mixed precision's parameters)
    table.push_back({"conv2d_backward_filter/" + name + "_into_arena", [=](const Maker& m) {
                       Tensor dw = to_dtype(m.uniform({7, 5, 3, 3}, 44), m.wide_output()),
                              db = to_dtype(m.uniform({7}, 45), m.wide_output());
                       m.be().conv2d_backward_filter(m.uniform({3, 7, oh, ow}, 43),
                                                     m.uniform({3, 5, 20, 23}, 40), g, 1.0, dw, db);
                       return Outputs{dw, db};
                     }});
  }
  // The CPU's two convolution algorithms forced (the CUDA backend ignores the hook): every padding
  // Winograd takes, odd sizes so that edge tiles are clipped, several chunks of samples. Winograd
  // runs the forward and data-gradient passes.
  for (cpu::ConvAlgorithm algorithm :
       {cpu::ConvAlgorithm::kIm2col, cpu::ConvAlgorithm::kWinograd}) {
    for (const auto& [pad_h, pad_w] : {std::pair<int64_t, int64_t>{0, 0}, {1, 1}, {2, 2}, {2, 0}}) {
      const Conv2dGeometry g{1, 1, pad_h, pad_w, 1, 1};
      const std::string name = str_cat(cpu::conv_algorithm_name(algorithm), "_pad", pad_h, pad_w);
      const int64_t oh = conv2d_out_size(19, 3, 1, pad_h, 1),
                    ow = conv2d_out_size(22, 3, 1, pad_w, 1);
      table.push_back({"conv2d_forward/" + name, [=](const Maker& m) {
                         cpu::ForcedConvAlgorithm force(algorithm);
                         Tensor y = m.empty({11, 7, oh, ow});
                         m.be().conv2d_forward(m.uniform({11, 5, 19, 22}, 40),
                                               m.uniform({7, 5, 3, 3}, 41), m.uniform({7}, 42), g,
                                               y);
                         return Outputs{y};
                       }});
      table.push_back({"conv2d_backward_data/" + name, [=](const Maker& m) {
                         cpu::ForcedConvAlgorithm force(algorithm);
                         Tensor dx = m.empty({11, 5, 19, 22});
                         m.be().conv2d_backward_data(m.uniform({11, 7, oh, ow}, 43),
                                                     m.uniform({7, 5, 3, 3}, 41), g, dx);
                         return Outputs{dx};
                       }});
      if (algorithm == cpu::ConvAlgorithm::kWinograd) continue;  // the filter gradient: im2col only
      table.push_back({"conv2d_backward_filter/" + name, [=](const Maker& m) {
                         cpu::ForcedConvAlgorithm force(algorithm);
                         Tensor dw = m.uniform({7, 5, 3, 3}, 44), db = m.uniform({7}, 45);
                         m.be().conv2d_backward_filter(m.uniform({11, 7, oh, ow}, 43),
                                                       m.uniform({11, 5, 19, 22}, 40), g, 1.0, dw,
                                                       db);
                         return Outputs{dw, db};
                       }});
    }
  }
  // The forward and the filter gradient of a one-channel convolution (patches of 9 values, as the
  // CNN's conv1), im2col's GEMM against the direct kernels; odd pixel counts reach the lanes'
  // tail, output rows of 22 and 20 end in a block overlapping the one before, and a geometry with
  // a row stride of 2, padding and dilation goes through the same padded planes.
  for (cpu::ConvAlgorithm algorithm : {cpu::ConvAlgorithm::kIm2col, cpu::ConvAlgorithm::kDirect}) {
    for (const Conv2dGeometry& g :
         {Conv2dGeometry{1, 1, 1, 1, 1, 1}, Conv2dGeometry{2, 1, 2, 0, 2, 1}}) {
      const int64_t oh = conv2d_out_size(19, 3, g.stride_h, g.pad_h, g.dilation_h),
                    ow = conv2d_out_size(22, 3, g.stride_w, g.pad_w, g.dilation_w);
      for (bool bias : {true, false}) {
        table.push_back({str_cat("conv2d_forward/", cpu::conv_algorithm_name(algorithm),
                                 "_one_channel_stride", g.stride_h, bias ? "" : "_no_bias"),
                         [=](const Maker& m) {
                           cpu::ForcedConvAlgorithm force(algorithm);
                           Tensor y = m.empty({11, 7, oh, ow});
                           m.be().conv2d_forward(m.uniform({11, 1, 19, 22}, 40),
                                                 m.uniform({7, 1, 3, 3}, 41),
                                                 bias ? m.uniform({7}, 42) : Tensor(), g, y);
                           return Outputs{y};
                         }});
        for (double beta : {0.0, 1.0}) {
          table.push_back(
              {str_cat("conv2d_backward_filter/", cpu::conv_algorithm_name(algorithm),
                       "_one_channel_stride", g.stride_h, bias ? "" : "_no_bias",
                       beta == 0 ? "_write" : "_accumulate"),
               [=](const Maker& m) {
                 cpu::ForcedConvAlgorithm force(algorithm);
                 Tensor dw = m.uniform({7, 1, 3, 3}, 44), db = bias ? m.uniform({7}, 45) : Tensor();
                 m.be().conv2d_backward_filter(m.uniform({11, 7, oh, ow}, 43),
                                               m.uniform({11, 1, 19, 22}, 40), g, beta, dw, db);
                 return bias ? Outputs{dw, db} : Outputs{dw};
               }});
        }
      }
    }
  }
  const Pool2dGeometry two{2, 2, 2, 2, 0, 0}, three{3, 3, 2, 2, 1, 1};
  for (const bool relu : {false, true}) {
    const std::string name = relu ? "max_pool2d_relu" : "max_pool2d";
    table.push_back({name, [=](const Maker& m) {
                       Tensor y = m.empty({4, 6, 16, 17});
                       Tensor at = Tensor::empty({4, 6, 16, 17}, DType::kInt32, m.device);
                       m.be().max_pool2d(m.uniform({4, 6, 33, 34}, 46), two, relu, y, at);
                       return Outputs{y, at};
                     }});
    table.push_back({name + "/padded", [=](const Maker& m) {
                       Tensor y = m.empty({4, 6, 17, 17});
                       Tensor at = Tensor::empty({4, 6, 17, 17}, DType::kInt32, m.device);
                       m.be().max_pool2d(m.uniform({4, 6, 33, 34}, 46), three, relu, y, at);
                       return Outputs{y, at};
                     }});
    table.push_back({name + "_backward", [=](const Maker& m) {
                       Tensor y = m.empty({4, 6, 17, 17});
                       Tensor at = Tensor::empty({4, 6, 17, 17}, DType::kInt32, m.device);
                       m.be().max_pool2d(m.uniform({4, 6, 33, 34}, 46), three, relu, y, at);
                       Tensor dx = m.uniform({4, 6, 33, 34}, 47);  // overwritten entirely
                       m.be().max_pool2d_backward(m.uniform({4, 6, 17, 17}, 48), at, dx);
                       return Outputs{dx};
                     }});
  }
  table.push_back({"avg_pool2d", [=](const Maker& m) {
                     Tensor y = m.empty({4, 6, 17, 17});
                     m.be().avg_pool2d(m.uniform({4, 6, 33, 34}, 46), three, y);
                     return Outputs{y};
                   }});
  table.push_back({"avg_pool2d_backward", [=](const Maker& m) {
                     Tensor dx = m.uniform({4, 6, 33, 34}, 47);
                     m.be().avg_pool2d_backward(m.uniform({4, 6, 17, 17}, 48), three, dx);
                     return Outputs{dx};
                   }});
  for (bool affine : {true, false}) {
    const std::string suffix = affine ? "" : "/no_affine";
    table.push_back(
        {"group_norm" + suffix, [=](const Maker& m) {
           Tensor y = m.empty({4, 12, 300}), mean = m.empty({4, 3}), rstd = m.empty({4, 3});
           m.be().group_norm(m.uniform({4, 12, 300}, 50, -2, 3), 3, 1e-5,
                             affine ? m.uniform({12}, 51) : Tensor(),
                             affine ? m.uniform({12}, 52) : Tensor(), y, mean, rstd);
           return Outputs{y, mean, rstd};
         }});
    table.push_back(
        {"group_norm_backward" + suffix, [=](const Maker& m) {
           Tensor x = m.uniform({4, 12, 300}, 50, -2, 3);
           Tensor y = m.empty({4, 12, 300}), mean = m.empty({4, 3}), rstd = m.empty({4, 3});
           Tensor w = affine ? m.uniform({12}, 51) : Tensor();
           m.be().group_norm(x, 3, 1e-5, w, Tensor(), y, mean, rstd);
           Tensor dx = m.empty({4, 12, 300});
           Tensor dw = affine ? m.uniform({12}, 53) : Tensor();
           Tensor db = affine ? m.uniform({12}, 54) : Tensor();
           m.be().group_norm_backward(m.uniform({4, 12, 300}, 55), x, 3, mean, rstd, w, dx, 1.0, dw,
                                      db);
           return affine ? Outputs{dx, dw, db} : Outputs{dx};
         }});
  }
  for (bool affine : {true, false}) {
    const std::string suffix = affine ? "" : "/no_affine";
    const Pool2dGeometry pool{2, 2, 2, 2, 0, 0};
    table.push_back({"group_norm_relu_max_pool2d" + suffix, [=](const Maker& m) {
                       Tensor y = m.empty({4, 12, 7, 10}), mean = m.empty({4, 3});
                       Tensor rstd = m.empty({4, 3});
                       Tensor at = Tensor::empty({4, 12, 7, 10}, DType::kInt32, m.device);
                       m.be().group_norm_relu_max_pool2d(
                           m.uniform({4, 12, 15, 20}, 50, -2, 3), 3, 1e-5,
                           affine ? m.uniform({12}, 51) : Tensor(),
                           affine ? m.uniform({12}, 52) : Tensor(), pool, y, at, mean, rstd);
                       // not argmax: a near tie between normalised values may fall either way
                       // in another precision (max_pool2d_relu's rows check argmax exactly)
                       return Outputs{y, mean, rstd};
                     }});
    table.push_back(
        {"group_norm_relu_max_pool2d_backward" + suffix, [=](const Maker& m) {
           Tensor x = m.uniform({4, 12, 15, 20}, 50, -2, 3);
           Tensor y = m.empty({4, 12, 7, 10}), mean = m.empty({4, 3}), rstd = m.empty({4, 3});
           Tensor found = Tensor::empty({4, 12, 7, 10}, DType::kInt32, m.device);
           Tensor w = affine ? m.uniform({12}, 51) : Tensor();
           m.be().group_norm_relu_max_pool2d(x, 3, 1e-5, w, Tensor(), pool, y, found, mean, rstd);
           // The argmax given, not found: the same on every device and in every precision
           // (each of a region's four places in turn, and -1 at every fifth output).
           std::vector<int32_t> chosen(4 * 12 * 7 * 10);
           for (size_t o = 0; o < chosen.size(); ++o) {
             const int32_t i = static_cast<int32_t>(o / 10 % 7), j = static_cast<int32_t>(o % 10);
             const int32_t place[] = {0, 1, 20, 21};
             chosen[o] = o % 5 == 0 ? -1 : 2 * i * 20 + 2 * j + place[o * 7 % 4];
           }
           const Tensor at = Tensor::from_vector<int32_t>({4, 12, 7, 10}, chosen).to(m.device);
           Tensor dx = m.uniform({4, 12, 15, 20}, 56);  // overwritten entirely
           Tensor dw = affine ? m.uniform({12}, 53) : Tensor();
           Tensor db = affine ? m.uniform({12}, 54) : Tensor();
           m.be().group_norm_relu_max_pool2d_backward(m.uniform({4, 12, 7, 10}, 55), at, x, 3, mean,
                                                      rstd, w, pool, dx, 1.0, dw, db);
           return affine ? Outputs{dx, dw, db} : Outputs{dx};
         }});
  }
  for (bool eval : {false, true}) {
    const std::string mode = eval ? "/eval" : "/train";
    table.push_back({"batch_norm" + mode, [=](const Maker& m) {
                       Tensor y = m.empty({8, 5, 513}), mean = m.empty({5}), rstd = m.empty({5});
                       Tensor rm = m.uniform({5}, 56), rv = m.uniform({5}, 57, 0.5, 2);
                       m.be().batch_norm(m.uniform({8, 5, 513}, 58, -2, 3), 1e-5, eval ? -1.0 : 0.1,
                                         eval, m.uniform({5}, 59), m.uniform({5}, 60), rm, rv, y,
                                         mean, rstd);
                       return Outputs{y, mean, rstd, rm, rv};
                     }});
    table.push_back(
        {"batch_norm_backward" + mode, [=](const Maker& m) {
           Tensor x = m.uniform({8, 5, 513}, 58, -2, 3);
           Tensor y = m.empty({8, 5, 513}), mean = m.empty({5}), rstd = m.empty({5});
           Tensor rm = m.uniform({5}, 56), rv = m.uniform({5}, 57, 0.5, 2);
           Tensor w = m.uniform({5}, 59);
           m.be().batch_norm(x, 1e-5, -1.0, eval, w, Tensor(), rm, rv, y, mean, rstd);
           Tensor dx = m.empty({8, 5, 513}), dw = m.uniform({5}, 61), db = m.uniform({5}, 62);
           m.be().batch_norm_backward(m.uniform({8, 5, 513}, 63), x, eval, mean, rstd, w, dx, 1.0,
                                      dw, db);
           return Outputs{dx, dw, db};
         }});
  }
  table.push_back(
      {"dropout", [](const Maker& m) {
         std::vector<int32_t> ids;
         for (int32_t i = 0; i < kRows; ++i) ids.push_back(3 * i + 7);
         Tensor y = m.empty({kRows, kCols});
         m.be().dropout(m.uniform({kRows, kCols}, 64), {0.3, 12345, 17}, m.ints(ids), y);
         return Outputs{y};
       }});
  for (UnaryOp op : {ACCRUE_UNARY_OPS(ACCRUE_TEST_UNARY_VALUE)}) {
    table.push_back({std::string("unary/") + op_name(op), [op](const Maker& m) {
                       Tensor y = m.empty({kFlat});
                       m.be().unary(op, m.uniform({kFlat}, 20, -3, 3), y);
                       return Outputs{y};
                     }});
    table.push_back({std::string("unary_backward/") + op_name(op), [op](const Maker& m) {
                       Tensor dx = m.empty({kFlat});
                       m.be().unary_backward(op, m.uniform({kFlat}, 21, -3, 3),
                                             m.uniform({kFlat}, 22), dx);
                       return Outputs{dx};
                     }});
  }
  table.push_back({"scale", [](const Maker& m) {
                     Tensor y = m.empty({kFlat});
                     m.be().scale(-1.5, m.uniform({kFlat}, 20), y);
                     return Outputs{y};
                   }});
  for (BinaryOp op : {ACCRUE_BINARY_OPS(ACCRUE_TEST_BINARY_VALUE)}) {
    table.push_back({std::string("binary/") + op_name(op), [op](const Maker& m) {
                       Tensor out = m.empty({kFlat});
                       m.be().binary(op, m.uniform({kFlat}, 23), m.uniform({kFlat}, 24), out);
                       return Outputs{out};
                     }});
  }
  table.push_back({"gemm/empty_inner", [](const Maker& m) {
                     // [37, 0] @ [0, 45]: nothing to sum, C = beta C
                     Tensor c = m.uniform({37, 45}, 27);
                     m.be().gemm(false, false, 0.5, m.empty({37, 0}), m.empty({0, 45}), 0.5, c);
                     return Outputs{c};
                   }});
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      table.push_back({str_cat("gemm/", ta ? "T" : "N", tb ? "T" : "N"), [=](const Maker& m) {
                         // op(a) [37, kCols] @ op(b) [kCols, 45], accumulated into c (beta 1)
                         Tensor a = m.uniform(ta ? Shape{kCols, 37} : Shape{37, kCols}, 25);
                         Tensor b = m.uniform(tb ? Shape{45, kCols} : Shape{kCols, 45}, 26);
                         Tensor c = m.uniform({37, 45}, 27);
                         m.be().gemm(ta, tb, 0.5, a, b, 1.0, c);
                         return Outputs{c};
                       }});
      table.push_back(
          {str_cat("gemm/", ta ? "T" : "N", tb ? "T" : "N", "_into_float32"), [=](const Maker& m) {
             // the weight-gradient GEMM of mixed precision: 16-bit operands,
             // accumulated into a float32 C with beta = 1
             Tensor a = m.uniform(ta ? Shape{kCols, 37} : Shape{37, kCols}, 25);
             Tensor b = m.uniform(tb ? Shape{45, kCols} : Shape{kCols, 45}, 26);
             Tensor c = to_dtype(random({37, 45}, 27), m.wide_output()).to(m.device);
             m.be().gemm(ta, tb, 1.0, a, b, 1.0, c);
             return Outputs{c};
           }});
    }
  }
  for (bool tb : {false, true}) {
    table.push_back({str_cat("gemm_batched/N", tb ? "T" : "N"), [=](const Maker& m) {
                       // 7 matrices op(a) [29, 33] @ op(b) [33, 31], accumulated (beta 1)
                       Tensor a = m.uniform({7, 29, 33}, 28);
                       Tensor b = m.uniform(tb ? Shape{7, 31, 33} : Shape{7, 33, 31}, 29);
                       Tensor c = m.uniform({7, 29, 31}, 30);
                       m.be().gemm_batched(false, tb, 0.5, a, b, 1.0, c);
                       return Outputs{c};
                     }});
  }
  table.push_back({"gemm_batched/TN", [](const Maker& m) {
                     // the weight side of bmm's backward: op(a) = a^T
                     Tensor a = m.uniform({5, 41, 19}, 31), b = m.uniform({5, 41, 23}, 32);
                     Tensor c = m.empty({5, 19, 23});
                     m.be().gemm_batched(true, false, 1.0, a, b, 0.0, c);
                     return Outputs{c};
                   }});
  for (double max_norm : {0.0, 1.0, 1e9}) {
    for (bool finite : {true, false}) {
      table.push_back({str_cat("boundary/max_norm_", max_norm, finite ? "" : "_non_finite"),
                       [=](const Maker& m) {
                         Tensor out = m.empty({4});
                         Tensor steps = m.ints({4});
                         Tensor no_scaler;
                         m.be().boundary(m.values({2}, {9.0, finite ? 0.0 : 2.0}), 0.5, max_norm,
                                         {}, no_scaler, out, steps);
                         return Outputs{out, steps};
                       }});
      // Loss scaling: unscaled norm and coefficient; the scale grows after the interval's last
      // clean window, backs off after an overflow, and stays put when not dynamic.
      for (bool dynamic : {false, true}) {
        table.push_back({str_cat("boundary/loss_scale_", dynamic ? "dynamic" : "fixed", "_",
                                 max_norm, finite ? "" : "_non_finite"),
                         [=](const Maker& m) {
                           Tensor out = m.empty({4});
                           Tensor steps = m.ints({4});
                           Tensor scaler = m.values({2}, {1024.0, 6.0});
                           LossScaling ls;
                           ls.dynamic = dynamic;
                           ls.growth_interval = 7;
                           m.be().boundary(m.values({2}, {9.0 * 1024 * 1024, finite ? 0.0 : 2.0}),
                                           0.5, max_norm, ls, scaler, out, steps);
                           return Outputs{out, steps, scaler};
                         }});
      }
    }
  }
  for (bool decoupled : {false, true}) {
    for (bool skip : {false, true}) {
      table.push_back({str_cat("adam_step/", decoupled ? "adamw" : "adam", skip ? "_skip" : ""),
                       [=](const Maker& m) {
                         Tensor p = m.uniform({kFlat}, 28), g = m.uniform({kFlat}, 29);
                         Tensor mo = m.uniform({kFlat}, 30, -0.1, 0.1);
                         Tensor v = m.uniform({kFlat}, 31, 0.01, 1);
                         const AdamArgs hp{1e-2, 0.9, 0.999, 1e-8, 0.05, decoupled};
                         Tensor none;
                         m.be().adam_step(hp, boundary_of(m, 0.7, skip), m.ints({3}), p, g, mo, v,
                                          none);
                         return Outputs{p, g, mo, v};
                       }});
      // With a 16-bit working copy: the pass writes exactly the new parameter, rounded (and
      // leaves it alone on a skipped step).
      for (DType half : {DType::kBFloat16, DType::kFloat16}) {
        table.push_back(
            {str_cat("adam_step/", decoupled ? "adamw" : "adam", skip ? "_skip" : "", "_working_",
                     dtype_name(half)),
             [=](const Maker& m) {
               Tensor p = m.uniform({kFlat}, 28), g = m.uniform({kFlat}, 29);
               Tensor mo = m.uniform({kFlat}, 30, -0.1, 0.1);
               Tensor v = m.uniform({kFlat}, 31, 0.01, 1);
               Tensor w = full({kFlat}, 7.0, half, m.device);
               const AdamArgs hp{1e-2, 0.9, 0.999, 1e-8, 0.05, decoupled};
               m.be().adam_step(hp, boundary_of(m, 0.7, skip), m.ints({3}), p, g, mo, v, w);
               const Tensor expect = skip ? full({kFlat}, 7.0, half) : to_dtype(p, half);
               return Outputs{p, sub(to_dtype(w.to(Device::cpu()), DType::kFloat64),
                                     to_dtype(expect.to(Device::cpu()), DType::kFloat64))};
             }});
      }
    }
  }
  for (bool nesterov : {false, true}) {
    for (bool skip : {false, true}) {
      table.push_back(
          {str_cat("sgd_step/", nesterov ? "nesterov" : "momentum", skip ? "_skip" : ""),
           [=](const Maker& m) {
             Tensor p = m.uniform({kFlat}, 32), g = m.uniform({kFlat}, 33);
             Tensor buf = m.uniform({kFlat}, 34);
             const SgdArgs hp{1e-1, 0.9, 0.0, 1e-3, nesterov};
             Tensor w = Tensor::empty({kFlat}, DType::kBFloat16, m.device);
             m.be().sgd_step(hp, boundary_of(m, 0.7, skip), m.ints({5}), p, g, buf, w);
             const Tensor expect =
                 to_dtype(to_dtype(p, DType::kBFloat16), DType::kFloat64).to(Device::cpu());
             const Tensor diff = sub(to_dtype(w, DType::kFloat64).to(Device::cpu()), expect);
             return skip ? Outputs{p, g, buf} : Outputs{p, g, buf, diff};
           }});
    }
  }
  return table;
}

void PrintTo(const Row& r, std::ostream* out) {
  *out << r.name;
}

TEST(Backend, EveryPrimitiveHasARow) {
  std::set<std::string> covered;
  for (const Row& r : rows()) covered.insert(r.name.substr(0, r.name.find('/')));
  for (const char* name : kBackendPrimitives) {
    EXPECT_TRUE(covered.count(name)) << "primitive '" << name << "' has no row in the table";
  }
}

// ACCRUE_TRACE's decorator prints each primitive with its arguments and forwards it unchanged.
TEST(Backend, TracingDecoratorPrintsAndForwards) {
  std::ostringstream log;
  const auto tracer = make_tracing_backend(backend_for(Device::cpu()), log);
  Tensor x = full({2, 3}, 1.0), w = full({4, 3}, 0.5), b = full({4}, 1.0);
  Tensor y = Tensor::empty({2, 4});
  tracer->linear_forward(x, w, b, false, y);
  tracer->unary(UnaryOp::kRelu, y, y);
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(8, 2.5f));
  EXPECT_EQ(log.str(),
            "[trace] linear_forward(float32[2, 3] on cpu, float32[4, 3] on cpu, float32[4] on cpu, "
            "false, float32[2, 4] on cpu)\n"
            "[trace] unary(relu, float32[2, 4] on cpu, float32[2, 4] on cpu)\n");
}

class BackendTable : public ::testing::TestWithParam<Row> {};

// One unit in the last place at 1 (2^-7 for bfloat16, 2^-10 for float16): the bound on one
// rounding of the result, relative above 1 and absolute below (max_rel_error's measure).
double format_eps(DType t) {
  switch (t) {
    case DType::kBFloat16:
      return std::ldexp(1.0, -7);
    case DType::kFloat16:
      return std::ldexp(1.0, -10);
    case DType::kFloat32:
      return 2e-5;
    default:
      return 1e-12;
  }
}

void expect_matches(const Row& row, const Outputs& got, const Outputs& reference, DType dtype,
                    Device device) {
  ASSERT_EQ(got.size(), reference.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].shape(), reference[i].shape());
    EXPECT_LT(max_rel_error(got[i], reference[i]), format_eps(dtype))
        << row.name << " output " << i << " in " << dtype_name(dtype) << " on " << device.str();
  }
}

TEST_P(BackendTable, MatchesTheFloat64CpuReference) {
  const Row& row = GetParam();
  const Outputs reference = row.run({Device::cpu(), DType::kFloat64});
  for (Device device : devices()) {
    if (row.name.rfind("conv2d", 0) == 0) ACCRUE_SKIP_UNLESS_CONVOLVES(device);
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      if (device.is_cpu() && dtype == DType::kFloat64) continue;
      expect_matches(row, row.run({device, dtype}), reference, dtype, device);
    }
  }
}

TEST_P(BackendTable, SixteenBitRunsMatchTheReferenceOnTheSameInputs) {
  const Row& row = GetParam();
  if (!takes_half(row.name)) {
    // A primitive without 16-bit support says so, naming itself and the dtype.
    if (row.name.rfind("count_equal", 0) == 0 || row.name.find("working") != std::string::npos ||
        row.name.rfind("boundary", 0) == 0) {
      return;  // int32 only, or float32 arenas by design: nothing to refuse
    }
    try {
      row.run({Device::cpu(), DType::kBFloat16});
      ADD_FAILURE() << row.name << " took bfloat16 without a 16-bit row";
    } catch (const DTypeError& e) {
      EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
    }
    return;
  }
  for (DType half : {DType::kBFloat16, DType::kFloat16}) {
    const Outputs reference = row.run({Device::cpu(), DType::kFloat64, half});
    for (Device device : devices()) {
      if (half_on_cpu_only(row.name) && !device.is_cpu()) {
        if (row.name.rfind("conv2d", 0) == 0 && !conv_unavailable_reason(device).empty()) continue;
        EXPECT_THROW(row.run({device, half, half}), DTypeError)
            << row.name << " on " << device.str();
        continue;
      }
      expect_matches(row, row.run({device, half, half}), reference, half, device);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backend, BackendTable, ::testing::ValuesIn(rows()), [](const auto& info) {
  std::string name = info.param.name;
  for (char& c : name) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
});

}  // namespace
}  // namespace accrue::testing
