// The backend table: every primitive of kernels/backend.h, called directly, at sizes that reach
// the parallel CPU loops, several CUDA blocks and odd tails. Each row runs in float64 on the CPU
// (the reference), then in float32 on the CPU and in float32 and float64 on every other device,
// and every output is compared with the reference. The rows of the primitives that take 16-bit
// tensors run in bfloat16 and float16 too, against a float64 reference fed the same rounded
// inputs, with a tolerance of one unit in the last place of the format (the result's single
// rounding; the float32 arithmetic inside adds orders of magnitude less). A primitive without
// a row fails EveryPrimitiveHasARow, so a new primitive cannot land untested.
#include <cstring>
#include <optional>
#include <set>
#include <tuple>

#include <cblas.h>
#include <omp.h>

#include "kernels/backend.h"
#include "kernels/cpu/bf16_products.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/exp_probe.h"
#include "kernels/cpu/half_lanes_probe.h"
#include "kernels/cpu/rows.h"
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

// What the convolution rows skip on: nothing on the CPU; on a GPU, nothing in a build with
// cuDNN, else the build's reason (no CUDA at all, or "built without cuDNN").
TEST(Backend, ConvolutionsSayWhyTheyCannotRunOnADevice) {
  EXPECT_EQ(conv_unavailable_reason(Device::cpu()), "");
  const std::string gpu = conv_unavailable_reason(Device::cuda(0));
  if (!cuda_built()) {
    EXPECT_EQ(gpu, cuda_unavailable_reason());
  } else if (!gpu.empty()) {
    EXPECT_EQ(gpu.rfind("built without cuDNN", 0), 0u) << gpu;
  }
}

// A convolution for the direct kernels' tests: x [n, c, h, w], w [o, c, kh, kw].
struct DirectCase {
  int64_t n, c, o, h, w, kh, kw;
  Conv2dGeometry g;
  int64_t oh() const { return conv2d_out_size(h, kh, g.stride_h, g.pad_h, g.dilation_h); }
  int64_t ow() const { return conv2d_out_size(w, kw, g.stride_w, g.pad_w, g.dilation_w); }
  cpu::ConvShape shape() const { return {n, c, h, w, o, kh, kw, oh(), ow()}; }
  std::string str() const {
    return str_cat(n, " x ", c, " -> ", o, " at ", h, " x ", w, ", filter ", kh, " x ", kw);
  }
};

// The direct filter gradient (patches of at most 9 values) computes the same sums as im2col's
// GEMM: in float64 they agree to rounding, with and without the bias, for every patch size it
// takes (1x1 to 3x3 filters, one or two input channels), strided and dilated geometries, pixel
// counts below, at and past its 16 lanes, one sample and several chunks.
TEST(Backend, DirectFilterGradientEqualsIm2colInFloat64) {
  Backend& be = backend_for(Device::cpu());
  const DirectCase cases[] = {
      {1, 1, 3, 5, 6, 3, 3, {1, 1, 1, 1, 1, 1}},    {11, 1, 7, 19, 22, 3, 3, {1, 1, 0, 0, 1, 1}},
      {37, 1, 5, 28, 28, 3, 3, {1, 1, 1, 1, 1, 1}}, {5, 2, 4, 9, 8, 2, 2, {2, 1, 1, 0, 1, 2}},
      {3, 1, 2, 4, 4, 1, 1, {1, 1, 0, 0, 1, 1}},    {6, 1, 3, 12, 10, 3, 2, {1, 2, 2, 1, 2, 1}}};
  for (const DirectCase& k : cases) {
    ASSERT_TRUE(cpu::direct_applies(k.shape(), k.g, cpu::ConvPass::kBackwardFilter));
    const Tensor x = testing::random({k.n, k.c, k.h, k.w}, 1);
    const Tensor dy = testing::random({k.n, k.o, k.oh(), k.ow()}, 4);
    const Tensor dw0 = testing::random({k.o, k.c, k.kh, k.kw}, 5);
    const Tensor db0 = testing::random({k.o}, 6);
    auto run = [&](cpu::ConvAlgorithm algorithm, double beta) {
      cpu::ForcedConvAlgorithm force(algorithm);
      Tensor dw = dw0.clone(), db = db0.clone();
      be.conv2d_backward_filter(dy, x, k.g, beta, dw, db);
      return std::vector<Tensor>{dw, db};
    };
    for (double beta : {0.0, 1.0}) {
      const std::vector<Tensor> im2col = run(cpu::ConvAlgorithm::kIm2col, beta);
      const std::vector<Tensor> direct = run(cpu::ConvAlgorithm::kDirect, beta);
      for (size_t i = 0; i < im2col.size(); ++i) {
        EXPECT_LT(max_rel_error(direct[i], im2col[i]), 1e-13)
            << (i == 0 ? "dw" : "dbias") << " of " << k.str() << ", beta " << beta;
      }
    }
  }
}

// The direct forward (patches of at most 9 values, stride 1 along rows) computes the convolution
// itself: in float64 it equals im2col's GEMM to rounding for every patch size from 1 to 9 (one to
// nine input channels), strided rows, dilation and padding, one block of 16 outputs a row and rows
// whose last block overlaps the one before, with and without the bias. Where OpenBLAS's kernels
// sum such a product as one multiply-add chain (cpu::blas_chains_short_products, the rule that
// makes the direct forward the default), it gives im2col's bytes in float32 as well.
TEST(Backend, DirectForwardEqualsIm2col) {
  Backend& be = backend_for(Device::cpu());
  const DirectCase cases[] = {
      {1, 1, 3, 5, 16, 3, 3, {1, 1, 1, 1, 1, 1}},   {11, 1, 7, 19, 22, 3, 3, {1, 1, 0, 0, 1, 1}},
      {37, 1, 5, 28, 28, 3, 3, {1, 1, 1, 1, 1, 1}}, {5, 2, 4, 9, 40, 2, 2, {2, 1, 1, 0, 1, 2}},
      {3, 9, 2, 4, 17, 1, 1, {1, 1, 0, 0, 1, 1}},   {6, 1, 3, 12, 33, 3, 2, {2, 1, 2, 1, 2, 1}},
      {4, 1, 6, 7, 18, 1, 3, {1, 1, 0, 1, 1, 1}}};
  for (const DirectCase& k : cases) {
    ASSERT_TRUE(cpu::direct_applies(k.shape(), k.g, cpu::ConvPass::kForward));
    for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
      if (dtype == DType::kFloat32 && !cpu::blas_chains_short_products()) continue;
      const Tensor x = to_dtype(testing::random({k.n, k.c, k.h, k.w}, 1), dtype);
      const Tensor w = to_dtype(testing::random({k.o, k.c, k.kh, k.kw}, 2), dtype);
      const Tensor b = to_dtype(testing::random({k.o}, 3), dtype);
      for (bool bias : {true, false}) {
        auto run = [&](cpu::ConvAlgorithm algorithm) {
          cpu::ForcedConvAlgorithm force(algorithm);
          Tensor y = Tensor::empty({k.n, k.o, k.oh(), k.ow()}, dtype, Device::cpu());
          be.conv2d_forward(x, w, bias ? b : Tensor(), k.g, y);
          return y;
        };
        const Tensor im2col = run(cpu::ConvAlgorithm::kIm2col);
        const Tensor direct = run(cpu::ConvAlgorithm::kDirect);
        const std::string where = str_cat(dtype_name(dtype), " ", k.str(), bias ? "" : ", no bias");
        if (dtype == DType::kFloat64) {
          EXPECT_LT(max_rel_error(direct, im2col), 1e-13) << where;
        } else {
          EXPECT_EQ(std::memcmp(direct.data<float>(), im2col.data<float>(), direct.nbytes()), 0)
              << where << ", OpenBLAS " << cpu::blas_core();
        }
      }
    }
  }
}

// The 16-bit direct kernels (bfloat16 and float16 convolutions take them wherever they apply) are
// the float32 direct kernels on the widened operands, bit for bit: the forward's y is float32's
// rounded once, the filter gradient into a float32 arena (beta 0 and 1) is float32's bytes, and
// into 16-bit dw and dbias it is float32's on the widened values, rounded once. The cases reach
// the lanes' tails, overlapping last blocks, strides, dilation, padding and several chunks.
TEST(Backend, SixteenBitDirectConvolutionsAreTheFloat32OnesOnWidenedOperands) {
  Backend& be = backend_for(Device::cpu());
  const DirectCase cases[] = {
      {1, 1, 3, 5, 16, 3, 3, {1, 1, 1, 1, 1, 1}},   {11, 1, 7, 19, 22, 3, 3, {1, 1, 0, 0, 1, 1}},
      {37, 1, 5, 28, 28, 3, 3, {1, 1, 1, 1, 1, 1}}, {5, 2, 4, 9, 40, 2, 2, {2, 1, 1, 0, 1, 2}},
      {6, 1, 3, 12, 33, 3, 2, {2, 1, 2, 1, 2, 1}},  {3, 1, 2, 4, 4, 1, 1, {1, 1, 0, 0, 1, 1}}};
  const auto bytes_equal = [](const Tensor& a, const Tensor& b) {
    return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
           std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  for (const DirectCase& k : cases) {
    const bool forward = cpu::direct_applies(k.shape(), k.g, cpu::ConvPass::kForward);
    ASSERT_TRUE(cpu::direct_applies(k.shape(), k.g, cpu::ConvPass::kBackwardFilter));
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      const auto half = [&](const Shape& shape, uint64_t seed) {
        return to_dtype(testing::random(shape, seed), dtype);
      };
      const auto wide = [](const Tensor& t) { return to_dtype(t, DType::kFloat32); };
      const Tensor x = half({k.n, k.c, k.h, k.w}, 1), w = half({k.o, k.c, k.kh, k.kw}, 2);
      const Tensor b = half({k.o}, 3), dy = half({k.n, k.o, k.oh(), k.ow()}, 4);
      const Tensor dw0 = half({k.o, k.c, k.kh, k.kw}, 5), db0 = half({k.o}, 6);
      const std::string where = str_cat(dtype_name(dtype), " ", k.str());
      // the 16-bit forward as dispatched (nothing forced), or with an algorithm forced
      const auto forward_16 = [&](std::optional<cpu::ConvAlgorithm> algorithm, bool bias) {
        std::optional<cpu::ForcedConvAlgorithm> force;
        if (algorithm) force.emplace(*algorithm);
        Tensor y = Tensor::empty({k.n, k.o, k.oh(), k.ow()}, dtype, Device::cpu());
        be.conv2d_forward(x, w, bias ? b : Tensor(), k.g, y);
        return y;
      };
      if (!forward) {  // forcing the direct kernels where they do not apply lowers, as im2col does
        EXPECT_TRUE(bytes_equal(forward_16(cpu::ConvAlgorithm::kDirect, true),
                                forward_16(cpu::ConvAlgorithm::kIm2col, true)))
            << "forward, no direct kernel, " << where;
      }
      const Tensor dispatched[2] = {forward_16(std::nullopt, false),
                                    forward_16(std::nullopt, true)};
      Tensor dw_dispatched = wide(dw0), db_dispatched = wide(db0);
      be.conv2d_backward_filter(dy, x, k.g, 1.0, dw_dispatched, db_dispatched);
      cpu::ForcedConvAlgorithm force(cpu::ConvAlgorithm::kDirect);
      if (forward) {
        for (bool bias : {true, false}) {
          Tensor y32 = Tensor::empty({k.n, k.o, k.oh(), k.ow()}, DType::kFloat32, Device::cpu());
          be.conv2d_forward(wide(x), wide(w), bias ? wide(b) : Tensor(), k.g, y32);
          const Tensor y = forward_16(std::nullopt, bias);
          EXPECT_TRUE(bytes_equal(y, to_dtype(y32, dtype)))
              << "forward, " << where << (bias ? "" : ", no bias");
          // the dispatch picks the direct kernels without being forced to
          EXPECT_TRUE(bytes_equal(dispatched[bias], y))
              << "forward as dispatched, " << where << (bias ? "" : ", no bias");
        }
      }
      for (double beta : {0.0, 1.0}) {
        const std::string pass = str_cat(where, ", beta ", beta);
        // float32 under 16-bit operands: mixed precision's gradient arena
        Tensor dw32 = wide(dw0), db32 = wide(db0);
        be.conv2d_backward_filter(wide(dy), wide(x), k.g, beta, dw32, db32);
        Tensor dw_arena = wide(dw0), db_arena = wide(db0);
        be.conv2d_backward_filter(dy, x, k.g, beta, dw_arena, db_arena);
        EXPECT_TRUE(bytes_equal(dw_arena, dw32)) << "dw into float32, " << pass;
        EXPECT_TRUE(bytes_equal(db_arena, db32)) << "dbias into float32, " << pass;
        if (beta == 1.0) {  // the dispatch picks the direct kernels without being forced to
          EXPECT_TRUE(bytes_equal(dw_dispatched, dw_arena)) << "dw as dispatched, " << pass;
          EXPECT_TRUE(bytes_equal(db_dispatched, db_arena)) << "dbias as dispatched, " << pass;
        }
        Tensor dw = dw0.clone(), db = db0.clone();
        be.conv2d_backward_filter(dy, x, k.g, beta, dw, db);
        EXPECT_TRUE(bytes_equal(dw, to_dtype(dw32, dtype))) << "16-bit dw, " << pass;
        EXPECT_TRUE(bytes_equal(db, to_dtype(db32, dtype))) << "16-bit dbias, " << pass;
      }
    }
  }
}

// The CPU permute (runs of the last dimension when it stays last, else single elements, in blocks
// that step through y's coordinates) against the index formula written out: y at coordinates c
// is x at the coordinates c[inverse of dims]. Raw bytes, each element's own index in them, so 2-,
// 4- and 8-byte elements alike; shapes with many blocks (runs and single elements, on threads), a
// few long runs, odd sizes, size-1 dimensions, rank 1 and an empty tensor.
TEST(Backend, PermuteMovesEachElementWhereItsIndexSays) {
  Backend& be = backend_for(Device::cpu());
  struct Case {
    Shape shape, dims;
    DType dtype;
  };
  const Case cases[] = {{{5, 37, 3, 4, 24}, {2, 0, 3, 1, 4}, DType::kFloat32},
                        {{300, 130}, {1, 0}, DType::kFloat32},  // single elements, threads
                        {{40, 1, 7, 33}, {2, 1, 0, 3}, DType::kFloat32},  // a carry through 1
                        {{2, 3, 40000}, {1, 0, 2}, DType::kFloat32},      // 6 long runs
                        {{3, 1, 5, 2}, {1, 3, 0, 2}, DType::kBFloat16},
                        {{17, 9, 13}, {1, 0, 2}, DType::kFloat64},
                        {{6, 5, 4, 3, 2}, {4, 3, 2, 1, 0}, DType::kInt32},
                        {{11}, {0}, DType::kFloat16},
                        {{0, 4}, {1, 0}, DType::kFloat32}};
  for (const Case& k : cases) {
    Tensor x = Tensor::empty(k.shape, k.dtype, Device::cpu());
    const size_t unit = dtype_size(k.dtype), rank = k.shape.size();
    auto* bytes = static_cast<unsigned char*>(x.raw());
    for (int64_t e = 0; e < x.numel(); ++e) {  // each element holds its own index (little-endian)
      for (size_t b = 0; b < unit; ++b)
        bytes[e * unit + b] = static_cast<unsigned char>(e >> (8 * b));
    }
    Shape out_shape;
    for (int64_t d : k.dims) out_shape.push_back(k.shape[static_cast<size_t>(d)]);
    Tensor y = Tensor::empty(out_shape, k.dtype, Device::cpu());
    be.permute(x, k.dims, y);
    for (int64_t j = 0; j < y.numel(); ++j) {
      std::vector<int64_t> at(rank);  // y's coordinates of element j, then x's flat index
      for (size_t d = rank, rest = static_cast<size_t>(j); d-- > 0;) {
        at[d] = static_cast<int64_t>(rest) % out_shape[d];
        rest /= static_cast<size_t>(out_shape[d]);
      }
      std::vector<int64_t> x_at(rank);
      for (size_t d = 0; d < rank; ++d) x_at[static_cast<size_t>(k.dims[d])] = at[d];
      int64_t source = 0;
      for (size_t d = 0; d < rank; ++d) source = source * k.shape[d] + x_at[d];
      ASSERT_EQ(std::memcmp(static_cast<const unsigned char*>(y.raw()) + j * unit,
                            bytes + source * unit, unit),
                0)
          << "element " << j << " of " << shape_str(k.shape) << " permuted by "
          << shape_str(k.dims);
    }
  }
}

// The 16-bit lanes of the direct convolutions (vec::load_widened, vec::store_rounded, as the
// library was built) convert as rows.h's row_to_float and row_from_float do, bit for bit: every
// bfloat16 and float16 pattern widened; rounded, every 4099th float pattern (all signs, exponents,
// subnormals and NaN payloads among them) and the edges: ties to even either way, the largest
// values that round down and the first that round to infinity, the smallest subnormals, -0.
TEST(Backend, SixteenBitLanesConvertAsTheRowConversions) {
  const auto check = [](auto zero) {
    using H = decltype(zero);
    std::vector<H> every(65536);
    for (uint32_t bits = 0; bits < 65536; ++bits) every[bits] = H::from_bits(uint16_t(bits));
    std::vector<float> want(every.size()), got(every.size());
    cpu::row_to_float(every.data(), want.data(), int64_t(every.size()));
    cpu::widen_lanes(every.data(), int64_t(every.size()), got.data());
    int64_t mismatches = 0;
    for (size_t i = 0; i < every.size(); ++i) {
      if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0 && ++mismatches <= 5) {
        ADD_FAILURE() << "widening 16-bit pattern " << i << ": " << got[i] << " against "
                      << want[i];
      }
    }
    EXPECT_EQ(mismatches, 0) << "widened";
    std::vector<float> values;
    for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
      const auto b = static_cast<uint32_t>(bits);
      float f;
      std::memcpy(&f, &b, sizeof f);
      values.push_back(f);
    }
    for (uint32_t b :
         {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0x477fefffu,
          0x477ff000u, 0x33000000u, 0x33000001u, 0x00000001u, 0x80000001u, 0x80000000u, 0x7f800001u,
          0xffc00001u, 0x7fbfffffu, 0x3f801000u, 0x3f803000u}) {
      float f;
      std::memcpy(&f, &b, sizeof f);
      values.push_back(f);
    }
    while (values.size() % 16 != 0) values.push_back(1.0f);
    std::vector<H> want16(values.size()), got16(values.size());
    cpu::row_from_float(values.data(), want16.data(), int64_t(values.size()));
    cpu::round_lanes(values.data(), int64_t(values.size()), got16.data());
    mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (want16[i].bits != got16[i].bits && ++mismatches <= 5) {
        ADD_FAILURE() << "rounding " << values[i] << ": bits " << got16[i].bits << " against "
                      << want16[i].bits;
      }
    }
    EXPECT_EQ(mismatches, 0) << "rounded, of " << values.size();
  };
  check(bf16{});
  check(f16{});
}

// vec::exp_lanes gives std::exp's bits (kernels/cpu/exp.h): every 4099th float bit pattern (all
// signs, magnitudes, subnormals and NaN payloads among them), the values softmax sees most densely
// ([-20, 0] in steps of 2^-9), and the edges of glibc's fast path, lanes mixed so that one slow
// lane sends a vector to the library. Checked once over all 2^32 floats on AVX-512 and AVX2 builds.
TEST(Backend, VectorExpGivesStdExpBits) {
  if (!cpu::vector_exp_in_kernels()) {
    GTEST_SKIP() << "the library targets no FMA (or has no glibc): its softmax loops call std::exp";
  }
  std::vector<float> values;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    const auto b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, sizeof f);
    values.push_back(f);
  }
  for (float f = -20.0f; f <= 0.0f; f += 0x1p-9f) values.push_back(f);
  // a vector of the fast path's edges alone, then one with a slow lane among them
  while (values.size() % 8 != 0) values.push_back(1.0f);
  const float below = std::nextafter(88.0f, 0.0f);
  for (float edge :
       {below,       -below,      0.0f,    -0.0f,    0x1p-149f, -0x1p-149f, 87.5f,     -87.5f,
        below,       -below,      0.0f,    -0.0f,    88.0f,     -88.0f,     88.72283f, 88.72284f,
        -103.27893f, -103.97208f, -104.0f, INFINITY, -INFINITY, NAN,        1.0f,      2.0f}) {
    values.push_back(edge);
  }
  std::vector<float> got(values.size());
  cpu::exp_floats(values.data(), static_cast<int64_t>(values.size()), got.data());
  int64_t mismatches = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const float want = std::exp(values[i]);
    if (std::memcmp(&want, &got[i], sizeof want) != 0 && ++mismatches <= 5) {
      ADD_FAILURE() << "exp(" << values[i] << "): " << got[i] << " against std::exp's " << want;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << values.size() << " values";
}

// The float softmax loops keep the bits of their scalar formulas with the vector exponentials:
// cross_entropy's probabilities exp(x - lse) and causal_softmax's exp(s x - max) / sum and zeros
// after the query (s x - max fused where the library targets FMA, as GCC contracts the scalar
// formula), rows of lengths around the vector width, values large enough to take glibc's slow path,
// outputs filled with NaN first.
TEST(Backend, SoftmaxKeepsScalarExpBits) {
  Backend& be = backend_for(Device::cpu());
  std::mt19937 gen(3);
  for (int64_t cols : {1, 7, 8, 9, 17, 40}) {
    for (float spread : {1.0f, 60.0f}) {
      const int64_t rows = 5;
      std::normal_distribution<float> normal(0.0f, spread);
      Tensor x = Tensor::empty({rows, cols}, DType::kFloat32, Device::cpu());
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = normal(gen);
      Tensor labels = Tensor::zeros({rows}, DType::kInt32, Device::cpu());
      Tensor loss = Tensor::empty({1}, DType::kFloat32, Device::cpu());
      Tensor probs = full({rows, cols}, NAN);
      be.cross_entropy(x, labels, loss, probs);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = x.data<float>() + r * cols;
        float max = row[0], total = 0;
        for (int64_t c = 1; c < cols; ++c) max = row[c] > max ? row[c] : max;
        for (int64_t c = 0; c < cols; ++c) total += std::exp(row[c] - max);
        const float lse = max + std::log(total);
        for (int64_t c = 0; c < cols; ++c) {
          const float want = std::exp(row[c] - lse), got = probs.data<float>()[r * cols + c];
          EXPECT_EQ(std::memcmp(&want, &got, sizeof want), 0)
              << "cross_entropy [" << rows << ", " << cols << "] spread " << spread << " row " << r
              << " column " << c << ": " << got << " against " << want;
        }
      }
      // causal_softmax over [1, T, T] with T = cols
      Tensor scores = Tensor::empty({1, cols, cols}, DType::kFloat32, Device::cpu());
      for (int64_t i = 0; i < scores.numel(); ++i) scores.data<float>()[i] = normal(gen);
      Tensor y = full({1, cols, cols}, NAN);
      const float s = 0.35f;
      be.causal_softmax(s, scores, y);
      const auto shifted = [&](float v, float max) {
        return cpu::kernels_fuse_scaled_shift() ? std::fma(s, v, -max) : s * v - max;
      };
      for (int64_t q = 0; q < cols; ++q) {
        const float* row = scores.data<float>() + q * cols;
        float max = s * row[0], total = 0;
        for (int64_t k = 1; k <= q; ++k) max = s * row[k] > max ? s * row[k] : max;
        for (int64_t k = 0; k <= q; ++k) total += std::exp(shifted(row[k], max));
        for (int64_t k = 0; k < cols; ++k) {
          const float want = k <= q ? std::exp(shifted(row[k], max)) / total : 0.0f;
          const float got = y.data<float>()[q * cols + k];
          EXPECT_EQ(std::memcmp(&want, &got, sizeof want), 0)
              << "causal_softmax T = " << cols << " spread " << spread << " query " << q << " key "
              << k << ": " << got << " against " << want;
        }
      }
    }
  }
}

// Winograd F(2x2, 3x3) computes the convolution itself: in float64 its two passes equal im2col's
// to rounding, at every padding it takes, with clipped edge tiles, one sample and a batch of
// several chunks, a 1x1 output, tile rows longer than one vector of tiles and more channels than
// one block of the filter transform. The choice rule: Winograd only where it applies and the
// channels pay for the transforms.
TEST(Backend, WinogradEqualsIm2colInFloat64) {
  Backend& be = backend_for(Device::cpu());
  struct Case {
    int64_t n, c, o, h, w, pad_h, pad_w;
  };
  const Case cases[] = {
      {1, 3, 4, 5, 6, 1, 1},  {11, 5, 7, 19, 22, 0, 0}, {37, 8, 9, 14, 14, 1, 1},
      {4, 2, 3, 7, 4, 2, 2},  {3, 4, 6, 9, 8, 2, 0},    {2, 3, 2, 3, 3, 0, 0},
      {3, 2, 3, 5, 37, 1, 1},    // rows of 19 tiles: three vectors, the last short
      {2, 70, 67, 5, 6, 1, 1}};  // filters transformed in blocks of 64 ins, a tail
  for (const Case& k : cases) {
    const Conv2dGeometry g{1, 1, k.pad_h, k.pad_w, 1, 1};
    const int64_t oh = conv2d_out_size(k.h, 3, 1, k.pad_h, 1);
    const int64_t ow = conv2d_out_size(k.w, 3, 1, k.pad_w, 1);
    const Tensor x = testing::random({k.n, k.c, k.h, k.w}, 1);
    const Tensor w = testing::random({k.o, k.c, 3, 3}, 2);
    const Tensor b = testing::random({k.o}, 3);
    const Tensor dy = testing::random({k.n, k.o, oh, ow}, 4);
    auto run = [&](cpu::ConvAlgorithm algorithm) {
      cpu::ForcedConvAlgorithm force(algorithm);
      Tensor y = Tensor::empty({k.n, k.o, oh, ow}, DType::kFloat64, Device::cpu());
      Tensor dx = Tensor::empty(x.shape(), DType::kFloat64, Device::cpu());
      be.conv2d_forward(x, w, b, g, y);
      be.conv2d_backward_data(dy, w, g, dx);
      return std::vector<Tensor>{y, dx};
    };
    const std::vector<Tensor> im2col = run(cpu::ConvAlgorithm::kIm2col);
    const std::vector<Tensor> winograd = run(cpu::ConvAlgorithm::kWinograd);
    const char* pass[] = {"forward", "backward_data"};
    for (size_t i = 0; i < im2col.size(); ++i) {
      EXPECT_LT(max_rel_error(winograd[i], im2col[i]), 1e-13)
          << pass[i] << " of " << k.n << " x " << k.c << " -> " << k.o << " at " << k.h << " x "
          << k.w << ", padding " << k.pad_h << ", " << k.pad_w;
    }
  }
  const cpu::ConvShape conv1{32, 1, 28, 28, 32, 3, 3, 28, 28},
      conv2{32, 32, 14, 14, 64, 3, 3, 14, 14};
  const Conv2dGeometry same{1, 1, 1, 1, 1, 1}, strided{2, 2, 1, 1, 1, 1}, wide{1, 1, 3, 3, 1, 1};
  using cpu::ConvAlgorithm, cpu::ConvPass;
  EXPECT_EQ(cpu::conv_algorithm(conv1, same, ConvPass::kForward),
            cpu::blas_chains_short_products() ? ConvAlgorithm::kDirect : ConvAlgorithm::kIm2col);
  EXPECT_EQ(cpu::conv_algorithm(conv2, same, ConvPass::kForward), ConvAlgorithm::kWinograd);
  EXPECT_EQ(cpu::conv_algorithm(conv2, same, ConvPass::kBackwardData), ConvAlgorithm::kWinograd);
  EXPECT_EQ(cpu::conv_algorithm(conv2, same, ConvPass::kBackwardFilter), ConvAlgorithm::kIm2col);
  EXPECT_EQ(cpu::conv_algorithm(conv1, same, ConvPass::kBackwardFilter), ConvAlgorithm::kDirect);
  EXPECT_EQ(cpu::conv_algorithm(conv1, strided, ConvPass::kBackwardFilter), ConvAlgorithm::kDirect);
  EXPECT_EQ(cpu::conv_algorithm(conv2, strided, ConvPass::kForward), ConvAlgorithm::kIm2col);
  EXPECT_EQ(cpu::conv_algorithm(conv2, wide, ConvPass::kForward), ConvAlgorithm::kIm2col);
  {
    cpu::ForcedConvAlgorithm force(ConvAlgorithm::kWinograd);
    EXPECT_EQ(cpu::conv_algorithm(conv1, same, ConvPass::kForward), ConvAlgorithm::kWinograd);
    EXPECT_EQ(cpu::conv_algorithm(conv2, strided, ConvPass::kForward), ConvAlgorithm::kIm2col);
    EXPECT_EQ(cpu::conv_algorithm(conv2, same, ConvPass::kBackwardFilter), ConvAlgorithm::kIm2col);
    EXPECT_EQ(cpu::conv_algorithm(conv1, same, ConvPass::kBackwardFilter), ConvAlgorithm::kDirect);
  }
  {
    cpu::ForcedConvAlgorithm force(ConvAlgorithm::kIm2col);
    EXPECT_EQ(cpu::conv_algorithm(conv1, same, ConvPass::kBackwardFilter), ConvAlgorithm::kIm2col);
  }
  {
    cpu::ForcedConvAlgorithm force(ConvAlgorithm::kIm2col);
    EXPECT_EQ(cpu::conv_algorithm(conv1, same, ConvPass::kForward), ConvAlgorithm::kIm2col);
  }
  // the direct kernels: small patches' filter gradient, and their forward at stride 1 along rows
  // with output rows of at least 16
  cpu::ForcedConvAlgorithm force(ConvAlgorithm::kDirect);
  EXPECT_EQ(cpu::conv_algorithm(conv2, same, ConvPass::kForward), ConvAlgorithm::kWinograd);
  EXPECT_EQ(cpu::conv_algorithm(conv1, same, ConvPass::kForward), ConvAlgorithm::kDirect);
  EXPECT_EQ(cpu::conv_algorithm(conv1, strided, ConvPass::kForward), ConvAlgorithm::kIm2col);
  EXPECT_EQ(cpu::conv_algorithm(conv1, same, ConvPass::kBackwardData), ConvAlgorithm::kIm2col);
  EXPECT_EQ(cpu::conv_algorithm(cpu::ConvShape{32, 1, 14, 15, 32, 3, 3, 14, 15}, same,
                                ConvPass::kForward),
            ConvAlgorithm::kIm2col);  // rows of 15
  EXPECT_EQ(cpu::conv_algorithm(conv2, same, ConvPass::kBackwardFilter), ConvAlgorithm::kIm2col);
}

// Direct cblas calls on one thread, as the backend makes them (OpenBLAS's own threading would sum
// in another order).
struct OneBlasThread {
  int threads = omp_get_max_threads();
  OneBlasThread() { omp_set_num_threads(1); }
  ~OneBlasThread() { omp_set_num_threads(threads); }
};

// The CPU backend computes a 32-row micro-batch's column blocks of x w^T (linear_forward, gemm)
// transposed where OpenBLAS's kernels make that the same sums (cpu::blas_transposes_exactly). On
// every machine the bytes must be those of the blocks as written, op(A) op(B_block) in 64-column
// blocks by single-threaded cblas calls (then bias and ReLU for linear_forward): the MLP's
// products, widths leaving a narrower last block (of 8 columns, and of 44: not a whole number of
// the transposition's 8 x 8 tiles), a 31-row batch and the data gradients dy w (never
// transposed), alpha 0.5 and beta 1.
TEST(Backend, MicroBatchProductsKeepTheBytesOfTheirUntransposedBlocks) {
  Backend& be = backend_for(Device::cpu());
  struct Case {
    bool linear, trans_b;
    int m, k, n;
    double alpha, beta;
  };
  const Case cases[] = {{true, true, 32, 784, 512, 1, 0},     {true, true, 32, 512, 256, 1, 0},
                        {true, true, 32, 256, 128, 1, 0},     {true, true, 32, 300, 200, 1, 0},
                        {true, true, 32, 300, 300, 1, 0},     {true, true, 31, 512, 256, 1, 0},
                        {false, true, 32, 784, 512, 0.5, 0},  {false, false, 32, 256, 512, 1, 0},
                        {false, false, 32, 128, 256, 0.5, 0}, {false, false, 32, 128, 3136, 1, 0},
                        {false, false, 32, 512, 784, 1, 0},   {false, false, 32, 256, 512, 1, 1}};
  for (const Case& c : cases) {
    const Tensor x = testing::random({c.m, c.k}, 1, DType::kFloat32);
    const Shape w_shape = c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n};
    const Tensor w = testing::random(w_shape, 2, DType::kFloat32);
    const Tensor b = testing::random({c.n}, 3, DType::kFloat32);
    for (bool relu : {false, true}) {
      if (relu && !c.linear) continue;
      Tensor y = testing::random({c.m, c.n}, 6, DType::kFloat32);
      std::vector<float> want(y.data<float>(), y.data<float>() + y.numel());
      if (c.linear) {
        be.linear_forward(x, w, b, relu, y);
      } else {
        be.gemm(false, c.trans_b, c.alpha, x, w, c.beta, y);
      }
      const OneBlasThread one;
      for (int col = 0; col < c.n; col += 64) {
        const float* w_block = w.data<float>() + (c.trans_b ? int64_t{col} * c.k : col);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, c.trans_b ? CblasTrans : CblasNoTrans, c.m,
                    std::min(64, c.n - col), c.k, float(c.alpha), x.data<float>(), c.k, w_block,
                    c.trans_b ? c.k : c.n, float(c.beta), want.data() + col, c.n);
      }
      for (size_t i = 0; c.linear && i < want.size(); ++i) {
        want[i] += b.data<float>()[i % c.n];
        if (relu) want[i] = want[i] > 0.0f ? want[i] : 0.0f;
      }
      EXPECT_EQ(std::memcmp(y.data<float>(), want.data(), want.size() * sizeof(float)), 0)
          << (c.linear ? "linear_forward " : "gemm ") << "[" << c.m << ", " << c.k << "] x "
          << (c.trans_b ? "w^T" : "w") << ", n " << c.n << ", alpha " << c.alpha << ", beta "
          << c.beta << ", relu " << relu << ", OpenBLAS " << cpu::blas_core();
    }
  }
}

// The premise of the transposed products (cpu::blas_transposes_exactly): where it holds, cblas
// gives C^T = B A^T the same bytes as C = A B^T for the shapes the backend computes transposed
// (the CNN's conv2 filter gradient per chunk, the MLP's forward blocks). Where it does not
// (OpenBLAS's AVX2 kernels) the backend keeps every product as written, and there is nothing to
// check.
// bfloat16 products on both paths (bf16_products.h): the library that multiplies bfloat16
// natively where this CPU and build have one, and sgemm on float32 panels. On each path the bits
// are the same on 1, 2 and 4 threads (accrue's fixed cut, one library call per block). The two
// paths sum the same exact products in other orders: within 1e-5 of the inner dimension (the
// products are ~N(0, 1), their magnitudes summed about k), and one bfloat16 rounding where C is
// bfloat16. Shapes of the MNIST MLP (forward x w^T, data gradient dy w, weight gradient dy^T x
// into float32 with beta 1), of attention (a batch of q k^T into bfloat16, and of q^T k into
// float32 with beta 1: batched matmuls on oneDNN, gemm.cpp) and of the MNIST CNN's
// conv2 (its three passes, the filter gradient into float32 with beta 1; K = 32 3 3).
TEST(Backend, Bf16ProductsAgreeOnBothPathsAndRepeatOnEveryThreadCount) {
  Backend& be = backend_for(Device::cpu());
  const auto bf = [](const Shape& shape, uint64_t seed) {
    return to_dtype(random(shape, seed, DType::kFloat32), DType::kBFloat16);
  };
  const Tensor x = bf({32, 784}, 1), w = bf({512, 784}, 2), dy = bf({32, 512}, 3),
               q = bf({8, 20, 16}, 4), k = bf({8, 20, 16}, 5);
  const Tensor grad0 = random({512, 784}, 6, DType::kFloat32);
  const Tensor image = bf({8, 32, 14, 14}, 7), filter = bf({64, 32, 3, 3}, 8),
               dimage = bf({8, 64, 14, 14}, 9);
  const Tensor filter_grad0 = random({64, 32, 3, 3}, 10, DType::kFloat32),
               bias_grad0 = random({64}, 11, DType::kFloat32);
  const Conv2dGeometry same{1, 1, 1, 1, 1, 1};
  struct Case {
    const char* name;
    int k;
    bool bf16_out;
    std::function<Tensor()> run;
  };
  const std::vector<Case> cases{
      {"forward x w^T", 784, true,
       [&] {
         Tensor y = Tensor::empty({32, 512}, DType::kBFloat16);
         be.gemm(false, true, 1.0, x, w, 0.0, y);
         return to_dtype(y, DType::kFloat32);
       }},
      {"data gradient dy w", 512, false,
       [&] {
         Tensor dx = Tensor::empty({32, 784}, DType::kFloat32);
         be.gemm(false, false, 1.0, dy, w, 0.0, dx);
         return dx;
       }},
      {"weight gradient dy^T x, beta 1", 32, false,
       [&] {
         Tensor dw = grad0.clone();
         be.gemm(true, false, 0.5, dy, x, 1.0, dw);
         return dw;
       }},
      {"attention q k^T", 16, true,
       [&] {
         Tensor s = Tensor::empty({8, 20, 20}, DType::kBFloat16);
         be.gemm_batched(false, true, 1.0, q, k, 0.0, s);
         return to_dtype(s, DType::kFloat32);
       }},
      {"a batch of q^T k into float32, beta 1", 20, false,
       [&] {
         Tensor s = random({8, 16, 16}, 12, DType::kFloat32);
         be.gemm_batched(true, false, 0.5, q, k, 1.0, s);
         return s;
       }},
      {"conv2 forward", 288, true,
       [&] {
         Tensor y = Tensor::empty({8, 64, 14, 14}, DType::kBFloat16);
         be.conv2d_forward(image, filter, Tensor(), same, y);
         return to_dtype(y, DType::kFloat32);
       }},
      {"conv2 data gradient", 64 * 9, true,
       [&] {
         Tensor dx = Tensor::empty({8, 32, 14, 14}, DType::kBFloat16);
         be.conv2d_backward_data(dimage, filter, same, dx);
         return to_dtype(dx, DType::kFloat32);
       }},
      {"conv2 filter gradient, beta 1", 8 * 196, false,
       [&] {
         Tensor dw = filter_grad0.clone(), db = bias_grad0.clone();
         be.conv2d_backward_filter(dimage, image, same, 1.0, dw, db);
         std::vector<float> both = dw.to_vector<float>(), bias = db.to_vector<float>();
         both.insert(both.end(), bias.begin(), bias.end());
         return Tensor::from_vector<float>({int64_t(both.size())}, both);
       }},
  };
  const int saved = cpu_threads();
  const cpu::Bf16Products before = cpu::bf16_products();
  for (const Case& c : cases) {
    std::vector<std::vector<float>> paths;
    for (cpu::Bf16Products p : {cpu::Bf16Products::kNative, cpu::Bf16Products::kConverted}) {
      cpu::set_bf16_products(p);
      SCOPED_TRACE(str_cat(c.name, " on ", cpu::bf16_products_library()));
      std::vector<std::vector<float>> runs;
      for (int threads : {1, 2, 4}) {
        set_cpu_threads(threads);
        runs.push_back(c.run().to_vector<float>());
      }
      EXPECT_EQ(runs[0], runs[1]);
      EXPECT_EQ(runs[0], runs[2]);
      paths.push_back(runs[0]);
    }
    for (size_t i = 0; i < paths[0].size(); ++i) {
      const double bound = 1e-5 * c.k + (c.bf16_out ? std::abs(paths[1][i]) / 128 : 0.0);
      EXPECT_NEAR(paths[0][i], paths[1][i], bound) << c.name << " element " << i;
    }
  }
  cpu::set_bf16_products(before);
  set_cpu_threads(saved);
  std::cout << "bfloat16 products natively on: " << [] {
    cpu::set_bf16_products(cpu::Bf16Products::kNative);
    return cpu::bf16_products_library();
  }() << "\n";
  cpu::set_bf16_products(before);
}

TEST(Backend, BlasTransposesExactlyWhereTheBackendTransposes) {
  if (!cpu::blas_transposes_exactly()) {
    GTEST_SKIP() << "OpenBLAS " << cpu::blas_core()
                 << ": the two orientations round differently, so the backend never transposes";
  }
  struct Case {
    int m, n, k;  // C [m, n] = A [m, k] B [n, k]^T
  };
  for (const Case& c : {Case{64, 288, 588}, Case{64, 288, 196}, Case{32, 64, 784},
                        Case{32, 64, 512}, Case{32, 64, 256}}) {
    const Tensor a = testing::random({c.m, c.k}, 4, DType::kFloat32);
    const Tensor b = testing::random({c.n, c.k}, 5, DType::kFloat32);
    std::vector<float> ab(size_t(c.m) * c.n), ba(size_t(c.n) * c.m);
    const OneBlasThread one;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c.m, c.n, c.k, 1.0f, a.data<float>(), c.k,
                b.data<float>(), c.k, 0.0f, ab.data(), c.n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c.n, c.m, c.k, 1.0f, b.data<float>(), c.k,
                a.data<float>(), c.k, 0.0f, ba.data(), c.m);
    int64_t differ = 0;
    for (int i = 0; i < c.m; ++i) {
      for (int j = 0; j < c.n; ++j) {
        differ += std::memcmp(&ab[i * c.n + j], &ba[j * c.m + i], sizeof(float)) != 0;
      }
    }
    EXPECT_EQ(differ, 0) << "[" << c.m << ", " << c.k << "] x [" << c.n << ", " << c.k
                         << "]^T on OpenBLAS " << cpu::blas_core();
  }
}

// The premise of the direct forward's default (cpu::blas_chains_short_products): where it holds,
// cblas computes C + A B, for the inner sizes k = 1 ... 9 of small patches, as C + (one
// multiply-add chain from +0 over k in order), bit for bit, in float32 and float64.
TEST(Backend, BlasChainsShortProductsWhereTheDirectForwardRuns) {
  if (!cpu::blas_chains_short_products()) {
    GTEST_SKIP()
        << "OpenBLAS " << cpu::blas_core()
        << ": short products are summed otherwise, so the direct forward is not the default";
  }
  const OneBlasThread one;
  const int m = 32, n = 200;
  for (int k = 1; k <= 9; ++k) {
    const Tensor a = testing::random({m, k}, 4), b = testing::random({k, n}, 5);
    const Tensor c = testing::random({m, 1}, 6);
    std::vector<double> ab(size_t(m) * n);
    std::vector<float> ab32(size_t(m) * n);
    const Tensor a32 = to_dtype(a, DType::kFloat32), b32 = to_dtype(b, DType::kFloat32),
                 c32 = to_dtype(c, DType::kFloat32);
    for (int i = 0; i < m; ++i) {
      std::fill_n(ab.begin() + i * n, n, c.data<double>()[i]);
      std::fill_n(ab32.begin() + i * n, n, c32.data<float>()[i]);
    }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a.data<double>(), k,
                b.data<double>(), n, 1.0, ab.data(), n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a32.data<float>(), k,
                b32.data<float>(), n, 1.0f, ab32.data(), n);
    int64_t differ = 0;
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double chain = 0;
        float chain32 = 0;
        for (int t = 0; t < k; ++t) {
          chain = std::fma(a.data<double>()[i * k + t], b.data<double>()[t * n + j], chain);
          chain32 = std::fma(a32.data<float>()[i * k + t], b32.data<float>()[t * n + j], chain32);
        }
        const double want = c.data<double>()[i] + chain;
        const float want32 = c32.data<float>()[i] + chain32;
        differ += std::memcmp(&ab[i * n + j], &want, sizeof want) != 0;
        differ += std::memcmp(&ab32[i * n + j], &want32, sizeof want32) != 0;
      }
    }
    EXPECT_EQ(differ, 0) << "[" << m << ", " << k << "] x [" << k << ", " << n << "] on OpenBLAS "
                         << cpu::blas_core();
  }
}

// Max pooling of `planes` planes [h, w] region by region, the first maximum in region order
// winning ties and the first NaN winning and staying; with relu the taps compete as relu(x)
// (-0 kept) and argmax is -1 where the maximum is not positive. Appends to y and at.
void reference_max_pool(const std::vector<double>& values, int64_t planes, int64_t h, int64_t w,
                        const Pool2dGeometry& g, bool relu, std::vector<double>& y,
                        std::vector<int32_t>& at) {
  const int64_t oh = (h + 2 * g.pad_h - g.kernel_h) / g.stride_h + 1;
  const int64_t ow = (w + 2 * g.pad_w - g.kernel_w) / g.stride_w + 1;
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double best = -INFINITY;
        int64_t best_at = -1;
        for (int64_t ih = i * g.stride_h - g.pad_h; ih < i * g.stride_h - g.pad_h + g.kernel_h;
             ++ih) {
          for (int64_t iw = j * g.stride_w - g.pad_w; iw < j * g.stride_w - g.pad_w + g.kernel_w;
               ++iw) {
            if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
            const double x = values[p * h * w + ih * w + iw];
            const double v = relu && x < 0 ? 0.0 : x;
            const bool nan_wins = std::isnan(v) && !std::isnan(best);
            if (best_at < 0 || v > best || nan_wins) best = v, best_at = ih * w + iw;
          }
        }
        y.push_back(best);
        at.push_back(relu && !(best > 0) ? -1 : static_cast<int32_t>(best_at));
      }
    }
  }
}

// Max pooling's contract on every device and floating type, against a region-by-region
// reference written here: the first maximum in region order (rows, then columns) wins ties, and
// the first NaN wins and stays. Values from a set of four with NaNs, -0 and infinities sprinkled
// in make both frequent; outputs are compared as bytes, so a zero's sign counts. The geometries
// take the CPU's inside-the-plane path (2x2 stride 2, 3x3 stride 1, 3x2 with strides 2, 1) and
// its clipped path (padding); the even widths take its 2x2 stride-2 path, with output rows of 1,
// 2, 6, 7 and 8 (two rows per float vector of 16 lanes, pairs crossing into the next plane where
// a plane has an odd number of rows; one row per float64 vector of 8 from 6 up), 14 (narrower than
// float's 16 lanes), 16, 20 and 35 (whole vectors, the last one overlapping), heights with an
// unpooled last row, and a last task of one plane. With relu (max_pool2d_relu) the taps compete as
// relu(x), so zeros tie often, and argmax is -1 where the maximum is not positive (a region of
// zeros and negatives). bfloat16 and float16 on the CPU (every value here is exact in both): the
// 2x2 stride-2 path reads and writes them in float lanes, the other geometries pool float32
// copies.
TEST(Backend, MaxPoolingKeepsTheFirstMaximumAndTheFirstNaN) {
  const Pool2dGeometry geometries[] = {
      {2, 2, 2, 2, 0, 0}, {3, 3, 1, 1, 0, 0}, {3, 2, 2, 1, 0, 0}, {3, 3, 2, 2, 1, 1}};
  std::vector<std::pair<Pool2dGeometry, bool>> pool_cases;  // each geometry without and with relu
  for (const bool relu : {false, true}) {
    for (const Pool2dGeometry& g : geometries) pool_cases.emplace_back(g, relu);
  }
  for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{9, 11},
                                                                     {9, 12},
                                                                     {14, 14},
                                                                     {8, 28},
                                                                     {6, 40},
                                                                     {4, 16},
                                                                     {5, 32},
                                                                     {3, 70},
                                                                     {7, 2},
                                                                     {6, 4}}) {
    const int64_t n = 3, c = 3;  // 9 planes: a group of 8 and one of 1 on the 2x2 path
    std::vector<double> values(n * c * h * w);
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = i % 17 == 5    ? std::nan("")
                  : i % 23 == 7  ? -0.0
                  : i % 29 == 11 ? INFINITY
                                 : static_cast<double>(((i * 2654435761u) >> 9) % 4) - 2.0;
    }
    for (const auto& [g, relu] : pool_cases) {
      const int64_t oh = (h + 2 * g.pad_h - g.kernel_h) / g.stride_h + 1;
      const int64_t ow = (w + 2 * g.pad_w - g.kernel_w) / g.stride_w + 1;
      if (oh <= 0 || ow <= 0) continue;  // the kernel is larger than the plane
      std::vector<double> expected_y;
      std::vector<int32_t> expected_at;
      reference_max_pool(values, n * c, h, w, g, relu, expected_y, expected_at);
      for (Device device : devices()) {
        for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
          if (is_half(dtype) && !device.is_cpu()) continue;  // CUDA pools float32 and float64
          Tensor x = Tensor::from_vector<double>({n, c, h, w}, values);
          x = to_dtype(x, dtype).to(device);
          Tensor y = Tensor::empty({n, c, oh, ow}, dtype, device);
          Tensor at = Tensor::empty({n, c, oh, ow}, DType::kInt32, device);
          backend_for(device).max_pool2d(x, g, relu, y, at);
          const std::vector<double> got_y =
              to_dtype(y, DType::kFloat64).to(Device::cpu()).to_vector<double>();
          const std::string where =
              str_cat(device.str(), " ", dtype_name(dtype), ", ", h, "x", w, ", kernel ",
                      g.kernel_h, "x", g.kernel_w, " pad ", g.pad_h, relu ? ", relu" : "");
          EXPECT_EQ(at.to(Device::cpu()).to_vector<int32_t>(), expected_at) << where;
          ASSERT_EQ(got_y.size(), expected_y.size());
          for (size_t k = 0; k < got_y.size(); ++k) {
            const double want = expected_y[k];
            if (std::isnan(want)) {
              EXPECT_TRUE(std::isnan(got_y[k])) << where << " output " << k;
            } else {  // bytes: the sign of a zero counts
              EXPECT_EQ(std::memcmp(&got_y[k], &want, sizeof(double)), 0)
                  << where << " output " << k << ": " << got_y[k] << " vs " << want;
            }
          }
        }
      }
    }
  }
}

// relu_bias_backward is, on every device and floating type, bit for bit the two primitives it
// fuses: dz is unary_backward's ReLU mask, dbias is sum_rows over dz as stored (beta 0 and 1, into
// a float32 dbias under 16-bit operands), dz written in full (it starts as NaN), also in place over
// dy; shapes with fewer rows than CUDA's column sums have row slices, none at all, odd columns,
// and more columns than one block covers.
TEST(Backend, ReluBiasBackwardIsTheMaskAndItsColumnSums) {
  const std::pair<int64_t, int64_t> shapes[] = {{300, 1031}, {5, 37}, {3, 1}, {0, 40}, {64, 96}};
  for (Device device : devices()) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
      Backend& be = backend_for(device);
      for (const auto& [rows, cols] : shapes) {
        const auto make = [&](const Shape& shape, uint64_t seed) {
          return to_dtype(testing::random(shape, seed), dtype).to(device);
        };
        const auto nans = [&](const Shape& shape) {
          return to_dtype(Tensor::from_vector<double>(
                              shape, std::vector<double>(size_t(shape_numel(shape)), std::nan(""))),
                          dtype)
              .to(device);
        };
        const Tensor y = make({rows, cols}, 1), dy = make({rows, cols}, 2);
        for (const bool wide : {false, true}) {
          if (wide && !is_half(dtype)) continue;
          const DType bias_dtype = wide ? DType::kFloat32 : dtype;
          for (double beta : {0.0, 1.0}) {
            const std::string where =
                str_cat(device.str(), " ", dtype_name(dtype), " [", rows, ", ", cols, "], dbias ",
                        dtype_name(bias_dtype), ", beta ", beta);
            const Tensor bias0 = to_dtype(testing::random({cols}, 3), bias_dtype).to(device);
            Tensor mask = nans({rows, cols}), sums = bias0.clone();
            be.unary_backward(UnaryOp::kRelu, y, dy, mask);
            be.sum_rows(mask, 1.0, beta, sums);
            Tensor dz = nans({rows, cols}), dbias = bias0.clone();
            be.relu_bias_backward(y, dy, dz, beta, dbias);
            const auto bytes = [](const Tensor& t) {
              const Tensor host = t.to(Device::cpu());
              const auto* p = static_cast<const unsigned char*>(host.raw());
              return std::vector<unsigned char>(p, p + host.nbytes());
            };
            EXPECT_EQ(bytes(dz), bytes(mask)) << "dz, " << where;
            EXPECT_EQ(bytes(dbias), bytes(sums)) << "dbias, " << where;
            Tensor in_place = dy.clone(), in_place_bias = bias0.clone();
            be.relu_bias_backward(y, in_place, in_place, beta, in_place_bias);
            EXPECT_EQ(bytes(in_place), bytes(mask)) << "dz over dy, " << where;
            EXPECT_EQ(bytes(in_place_bias), bytes(sums)) << "dbias with dz over dy, " << where;
          }
        }
      }
    }
  }
}

// max_pool2d_backward: dx = +0, then dx[argmax] += dy output by output in order, nothing where
// argmax is -1 (max_pool2d_relu's outputs that are not positive), even where dy there is NaN.
// Overlapping regions (3x3 or padded 2x2, stride 1) make inputs that take several adds; dy holds
// -0, so the bytes show any sign a zero picks up (the CPU loop adds +0 to a plane's first input
// where argmax is -1, and some planes' first input is also a region's maximum). 2x2 pooling at
// stride 2 routes each output to its own 2x2 cell, which the CPU spreads as vectors: output rows
// of 16 and 10 (8 a step, the last step overlapping), 7 (4 a step) and 3 (through local copies),
// heights with an unpooled last row; 3x3 pooling at stride 2 padded by 1 has as many outputs, but
// some route outside their cell, so the spread gives way to the adds in order. bfloat16 and
// float16 on the CPU: the adds in float32 on dy's 16-bit values, in order, each input rounded
// once (the spread writes the 16-bit planes directly; the adds run on float32 copies).
TEST(Backend, MaxPoolingBackwardAddsInOrderAndSkipsTheUnroutedOutputs) {
  const int64_t n = 2, c = 3;
  struct Case {
    Pool2dGeometry g;
    int64_t h, w;
  };
  // 34 x 34: over 256 outputs a plane (CUDA's block loops them); 80 x 80: a plane past the 48 KiB
  // of shared memory CUDA's block kernel holds, which then takes its thread-per-plane loop
  const Case cases[] = {{{3, 3, 1, 1, 0, 0}, 7, 9},   {{2, 2, 1, 1, 1, 1}, 7, 9},
                        {{2, 2, 2, 2, 0, 0}, 7, 32},  {{2, 2, 2, 2, 0, 0}, 8, 20},
                        {{2, 2, 2, 2, 0, 0}, 6, 14},  {{2, 2, 2, 2, 0, 0}, 5, 6},
                        {{3, 3, 2, 2, 1, 1}, 8, 8},   {{2, 2, 2, 2, 0, 0}, 34, 34},
                        {{3, 3, 2, 2, 1, 1}, 34, 34}, {{2, 2, 2, 2, 0, 0}, 80, 80}};
  for (const Case& k : cases) {
    const Pool2dGeometry& g = k.g;
    const int64_t h = k.h, w = k.w;
    const int64_t oh = (h + 2 * g.pad_h - g.kernel_h) / g.stride_h + 1;
    const int64_t ow = (w + 2 * g.pad_w - g.kernel_w) / g.stride_w + 1;
    const std::string where =
        str_cat(h, "x", w, ", kernel ", g.kernel_h, " stride ", g.stride_h, " pad ", g.pad_h);
    std::vector<double> values(n * c * h * w), grads(n * c * oh * ow);
    for (size_t i = 0; i < values.size(); ++i) values[i] = double((i * 7919) % 10) - 5.0;
    for (int64_t p = 0; p < n * c; p += 2) values[p * h * w] = 9.0;  // a real target at element 0
    for (int64_t p = 1; p < n * c; p += 2) {  // a first cell of negatives: an unrouted output
      for (int64_t e : {int64_t{0}, int64_t{1}, w, w + 1}) values[p * h * w + e] = -1.0;
    }
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = i % 5 == 0 ? -0.0 : i % 11 == 3 ? std::nan("") : 0.1 * double(i % 13) - 0.6;
    }
    Tensor x = Tensor::from_vector<double>({n, c, h, w}, values);
    Tensor y = Tensor::empty({n, c, oh, ow}, DType::kFloat64, Device::cpu());
    Tensor at = Tensor::empty({n, c, oh, ow}, DType::kInt32, Device::cpu());
    backend_for(Device::cpu()).max_pool2d(x, g, true, y, at);
    const std::vector<int32_t> argmax = at.to_vector<int32_t>();
    for (size_t i = 0; i < grads.size(); i += 3) {
      if (argmax[i] < 0)
        grads[i] = std::nan("");  // what an unrouted output carries must not reach dx
    }
    int64_t unrouted = 0, unrouted_nan = 0, outside_cell = 0;
    for (int64_t p = 0; p < n * c; ++p) {
      for (int64_t o = 0; o < oh * ow; ++o) {
        const int32_t a = argmax[p * oh * ow + o];
        unrouted += a < 0;
        unrouted_nan += a < 0 && std::isnan(grads[p * oh * ow + o]);
        outside_cell += a >= 0 && (a / w / 2 != o / ow || a % w / 2 != o % ow);
      }
    }
    ASSERT_GT(unrouted, 0) << where;  // the branch-free loop adds +0 at an output's own index
    ASSERT_GT(unrouted_nan, 0) << where;
    ASSERT_EQ(argmax[0], 0) << where;  // element 0 also takes real adds, among those +0
    if (g.stride_h == 2) {
      ASSERT_EQ(outside_cell > 0, g.kernel_h == 3) << where;
    }
    const auto check = [&](auto zero, DType dtype, Device device) {
      using T = decltype(zero);
      std::vector<T> expected(values.size(), T(0));
      for (int64_t p = 0; p < n * c; ++p) {
        for (int64_t o = 0; o < oh * ow; ++o) {
          const int32_t a = argmax[p * oh * ow + o];
          if (a >= 0) expected[p * h * w + a] += static_cast<T>(grads[p * oh * ow + o]);
        }
      }
      // every input written: dx starts as NaN
      Tensor dx = to_dtype(Tensor::from_vector<double>(
                               {n, c, h, w}, std::vector<double>(values.size(), std::nan(""))),
                           dtype)
                      .to(device);
      backend_for(device).max_pool2d_backward(
          to_dtype(Tensor::from_vector<double>({n, c, oh, ow}, grads), dtype).to(device),
          at.to(device), dx);
      const std::vector<T> got = dx.to(Device::cpu()).to_vector<T>();
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(expected[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << device.str() << " " << where << " input " << i;
        } else {
          EXPECT_EQ(std::memcmp(&got[i], &expected[i], sizeof(T)), 0)
              << device.str() << " " << dtype_name(dtype) << " " << where << " input " << i << ": "
              << got[i] << " vs " << expected[i];
        }
      }
    };
    const auto check_16_bit = [&](DType dtype) {
      const Tensor dy = to_dtype(Tensor::from_vector<double>({n, c, oh, ow}, grads), dtype);
      const std::vector<float> dy_values = to_dtype(dy, DType::kFloat32).to_vector<float>();
      std::vector<float> sums(values.size(), 0.0f);
      for (int64_t p = 0; p < n * c; ++p) {
        for (int64_t o = 0; o < oh * ow; ++o) {
          const int32_t a = argmax[p * oh * ow + o];
          if (a >= 0) sums[p * h * w + a] += dy_values[p * oh * ow + o];
        }
      }
      const Tensor expected = to_dtype(Tensor::from_vector<float>({n, c, h, w}, sums), dtype);
      Tensor dx = to_dtype(Tensor::from_vector<double>(
                               {n, c, h, w}, std::vector<double>(values.size(), std::nan(""))),
                           dtype);
      backend_for(Device::cpu()).max_pool2d_backward(dy, at, dx);
      const std::vector<float> got = to_dtype(dx, DType::kFloat32).to_vector<float>();
      const auto* got_bits = static_cast<const uint16_t*>(dx.raw());
      const auto* want_bits = static_cast<const uint16_t*>(expected.raw());
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(sums[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << dtype_name(dtype) << " " << where << " input " << i;
        } else {
          EXPECT_EQ(got_bits[i], want_bits[i]) << dtype_name(dtype) << " " << where << " input "
                                               << i << ": " << got[i] << " vs " << sums[i];
        }
      }
    };
    for (Device device : devices()) {
      check(0.0f, DType::kFloat32, device);
      check(0.0, DType::kFloat64, device);
    }
    check_16_bit(DType::kBFloat16);
    check_16_bit(DType::kFloat16);
  }
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

// OpenBLAS's kernels: the core asked for (or "": keep) from the running core, the user's
// OPENBLAS_CORETYPE and the CPU's vector level (4 AVX-512 with BF16, 3 AVX-512, 2 AVX2, 1 older).
TEST(BlasCore, AsksForTheCpusOwnKernelsOnlyWhenTheRunningOnesAreLowerAndTheUserChoseNone) {
  struct Row {
    const char* running;
    const char* env;
    int cpu_level;
    const char* want;
  };
  const Row rows[] = {
      {"Prescott", nullptr, 4, "Cooperlake"},  // a Xeon OpenBLAS 0.3.21 does not know
      {"Prescott", "", 4, "Cooperlake"},       // empty is unset
      {"unknown", nullptr, 4, "Cooperlake"},
      {"SkylakeX", nullptr, 4, "Cooperlake"},
      {"Prescott", nullptr, 3, "SkylakeX"},
      {"Haswell", nullptr, 3, "SkylakeX"},
      {"Prescott", nullptr, 2, "Haswell"},
      {"Sandybridge", nullptr, 2, "Haswell"},
      {"Cooperlake", nullptr, 4, ""},  // OpenBLAS's own pick on a Zen 5
      {"SapphireRapids", nullptr, 4, ""},
      {"SkylakeX", nullptr, 3, ""},
      {"Zen", nullptr, 2, ""},
      {"Haswell", nullptr, 2, ""},
      {"Prescott", nullptr, 1, ""},     // nothing better on this CPU
      {"Prescott", "Prescott", 3, ""},  // the user's choice stands
      {"Haswell", "Haswell", 4, ""},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(cpu::blas_core_to_request(r.running, r.env, r.cpu_level), r.want)
        << r.running << ", OPENBLAS_CORETYPE " << (r.env ? r.env : "unset") << ", CPU level "
        << r.cpu_level;
  }
  EXPECT_EQ(cpu::blas_core_level("Cooperlake"), 4);
  EXPECT_EQ(cpu::blas_core_level("SkylakeX"), 3);
  EXPECT_EQ(cpu::blas_core_level("Zen"), 2);
  EXPECT_EQ(cpu::blas_core_level("Prescott"), 1);
  EXPECT_GE(cpu::cpu_vector_level(), 1);
  EXPECT_LE(cpu::cpu_vector_level(), 4);
}

// The CPU norms run sets side by side: group norm's forward two groups at a time and batch norm's
// two channels (their sums in one loop), layer norm's backward eight rows in vector lanes. Each
// set's results must be the bytes it gets in a call of its own: a sample's group norm (and the
// rows of group norm over [N, C, 1]) against the same call on that sample alone, a channel's batch
// norm against the call on that channel alone. Odd counts leave a set without a partner, and the
// row blocks end short.
namespace norm_sets {
bool same_bytes(const void* a, const Tensor& b) {
  return std::memcmp(a, b.raw(), b.nbytes()) == 0;
}
// x [N, C, S]'s channel k as [N, 1, S]
Tensor channel(const Tensor& x, int64_t k) {
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2);
  const size_t run = static_cast<size_t>(s) * dtype_size(x.dtype());
  Tensor out = Tensor::empty({n, 1, s}, x.dtype(), Device::cpu());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(static_cast<char*>(out.raw()) + i * run,
                static_cast<const char*>(x.raw()) + (i * c + k) * run, run);
  }
  return out;
}
// The first sample whose run of channel ch in whole [N, C, S] differs from alone [N, 1, S], or -1.
int64_t first_differing_sample(const Tensor& whole, const Tensor& alone, int64_t ch) {
  const size_t run = static_cast<size_t>(whole.size(2)) * dtype_size(whole.dtype());
  for (int64_t i = 0; i < whole.size(0); ++i) {
    if (std::memcmp(static_cast<const char*>(whole.raw()) + (i * whole.size(1) + ch) * run,
                    static_cast<const char*>(alone.raw()) + i * run, run) != 0) {
      return i;
    }
  }
  return -1;
}
}  // namespace norm_sets

TEST(Backend, NormsGiveEachGroupRowAndChannelTheBytesItGetsAlone) {
  using namespace norm_sets;
  Backend& be = backend_for(Device::cpu());
  const auto empty = [](const Shape& shape, DType dt) {
    return Tensor::empty(shape, dt, Device::cpu());
  };
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    struct GroupCase {
      int64_t n, c, s, groups;
    };
    // 15 groups (odd); rows of 4 groups and layer norms too short for blocks (rows one by one),
    // 130 features (the staging's 64 twice, then 2); rows of 4 groups and a layer norm in blocks
    // of 8 rows (16 tasks or more), the last block of 5
    for (const GroupCase& k :
         {GroupCase{5, 6, 7, 3}, GroupCase{11, 12, 1, 4}, GroupCase{19, 40, 1, 1},
          GroupCase{9, 130, 1, 1}, GroupCase{37, 12, 1, 4}, GroupCase{133, 70, 1, 1}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " group norm [" << k.n << ", " << k.c
                                        << ", " << k.s << "] groups " << k.groups);
      const Tensor x = random({k.n, k.c, k.s}, 1, dt, -2, 3), dy = random(x.shape(), 2, dt);
      const Tensor w = random({k.c}, 3, dt), b = random({k.c}, 4, dt);
      Tensor y = empty(x.shape(), dt), mean = empty({k.n, k.groups}, dt), rstd = mean.clone();
      Tensor dx = empty(x.shape(), dt), dw = empty({k.c}, dt), db = empty({k.c}, dt);
      be.group_norm(x, k.groups, 1e-5, w, b, y, mean, rstd);
      be.group_norm_backward(dy, x, k.groups, mean, rstd, w, dx, 0.0, dw, db);
      for (int64_t i = 0; i < k.n; ++i) {
        const Tensor xi = x.narrow(i, 1).clone(), dyi = dy.narrow(i, 1).clone();
        Tensor yi = empty(xi.shape(), dt), mean_i = empty({1, k.groups}, dt),
               rstd_i = mean_i.clone(), dxi = empty(xi.shape(), dt), none;
        be.group_norm(xi, k.groups, 1e-5, w, b, yi, mean_i, rstd_i);
        be.group_norm_backward(dyi, xi, k.groups, mean_i, rstd_i, w, dxi, 0.0, none, none);
        EXPECT_TRUE(same_bytes(y.narrow(i, 1).raw(), yi)) << "y of sample " << i;
        EXPECT_TRUE(same_bytes(mean.narrow(i, 1).raw(), mean_i)) << "mean of sample " << i;
        EXPECT_TRUE(same_bytes(rstd.narrow(i, 1).raw(), rstd_i)) << "rstd of sample " << i;
        EXPECT_TRUE(same_bytes(dx.narrow(i, 1).raw(), dxi)) << "dx of sample " << i;
      }
    }
    struct ChannelCase {
      int64_t n, c, s;
    };
    for (const ChannelCase& k : {ChannelCase{6, 5, 9}, ChannelCase{3, 4, 1}}) {
      const Tensor x = random({k.n, k.c, k.s}, 5, dt, -2, 3), dy = random(x.shape(), 6, dt);
      const Tensor w = random({k.c}, 7, dt), b = random({k.c}, 8, dt);
      Tensor running_mean = random({k.c}, 9, dt), running_var = random({k.c}, 10, dt, 0.5, 2);
      // training (the batch's statistics, the running ones updated), then evaluation (the running
      // statistics)
      for (bool use_running : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " batch norm [" << k.n << ", " << k.c << ", " << k.s
                     << "]" << (use_running ? " on its running statistics" : ""));
        const Tensor rm0 = running_mean.clone(), rv0 = running_var.clone();
        Tensor y = empty(x.shape(), dt), mean = empty({k.c}, dt), rstd = mean.clone();
        Tensor dx = empty(x.shape(), dt), dw = empty({k.c}, dt), db = empty({k.c}, dt);
        be.batch_norm(x, 1e-5, 0.1, use_running, w, b, running_mean, running_var, y, mean, rstd);
        be.batch_norm_backward(dy, x, use_running, mean, rstd, w, dx, 0.0, dw, db);
        for (int64_t ch = 0; ch < k.c; ++ch) {
          const Tensor xk = channel(x, ch), dyk = channel(dy, ch);
          Tensor rmk = rm0.narrow(ch, 1).clone(), rvk = rv0.narrow(ch, 1).clone();
          Tensor yk = empty(xk.shape(), dt), mean_k = empty({1}, dt), rstd_k = mean_k.clone();
          Tensor dxk = empty(xk.shape(), dt), dwk = empty({1}, dt), dbk = empty({1}, dt);
          const Tensor wk = w.narrow(ch, 1);
          be.batch_norm(xk, 1e-5, 0.1, use_running, wk, b.narrow(ch, 1), rmk, rvk, yk, mean_k,
                        rstd_k);
          be.batch_norm_backward(dyk, xk, use_running, mean_k, rstd_k, wk, dxk, 0.0, dwk, dbk);
          EXPECT_EQ(first_differing_sample(y, yk, ch), -1) << "y of channel " << ch;
          EXPECT_EQ(first_differing_sample(dx, dxk, ch), -1) << "dx of channel " << ch;
          for (auto [whole, alone, what] : {std::tuple{&mean, &mean_k, "mean"},
                                            {&rstd, &rstd_k, "rstd"},
                                            {&running_mean, &rmk, "running mean"},
                                            {&running_var, &rvk, "running var"},
                                            {&dw, &dwk, "dweight"},
                                            {&db, &dbk, "dbias"}}) {
            EXPECT_TRUE(same_bytes(whole->narrow(ch, 1).raw(), *alone))
                << what << " of channel " << ch;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace accrue::testing
