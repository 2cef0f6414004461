// The CPU convolution's algorithms against one another: the direct kernels against im2col (float64
// and float32, and the 16-bit direct kernels against float32's on the widened operands, bit for
// bit), Winograd against im2col in float64, and what a device without cuDNN says. The backend
// table (test_backend.cpp) checks every primitive against the float64 CPU on every device.
#include <cstring>
#include <optional>

#include "kernels/backend.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/conv.h"
#include "kernels/functors.h"
#include "test_util.h"

namespace accrue::testing {
namespace {

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

// CUDA's float32/float64 filter gradient is one GEMM over x's patches gathered by
// fn::LoweredFilterIndex and dy permuted (kernels/cuda/conv.cu, lowered_filter_gradient). The same
// index math, permutation and GEMM call run here on the CPU: dw = beta dw + rows^T cols equals the
// CPU's own filter gradient (im2col) in float64, for padded, strided, dilated and rectangular
// geometries, several channels each side, and beta 0 and 1.
TEST(Backend, TheCudaFilterGradientsLoweringIsTheFilterGradient) {
  Backend& be = backend_for(Device::cpu());
  const DirectCase cases[] = {{2, 3, 4, 7, 6, 3, 3, {1, 1, 1, 1, 1, 1}},
                              {3, 2, 5, 9, 8, 2, 3, {2, 1, 0, 1, 1, 2}},
                              {1, 1, 3, 5, 5, 1, 1, {1, 1, 0, 0, 1, 1}},
                              {4, 3, 2, 12, 10, 3, 2, {1, 2, 2, 1, 2, 1}},
                              {2, 4, 6, 6, 7, 5, 3, {3, 2, 2, 1, 1, 1}}};
  for (const DirectCase& k : cases) {
    const Tensor x = testing::random({k.n, k.c, k.h, k.w}, 1);
    const Tensor dy = testing::random({k.n, k.o, k.oh(), k.ow()}, 2);
    const Tensor dw0 = testing::random({k.o, k.c, k.kh, k.kw}, 3);
    const fn::LoweredFilterIndex index =
        fn::LoweredFilterIndex::of(k.c, k.h, k.w, k.kh, k.kw, k.oh(), k.ow(), k.g);
    const int64_t pixels = k.oh() * k.ow(), rows = k.n * pixels, patch = k.c * k.kh * k.kw;
    const std::vector<double> xs = x.to_vector<double>();
    std::vector<double> cols(static_cast<size_t>(rows * patch));
    for (int i = 0; i < static_cast<int>(cols.size()); ++i) {
      const int from = index.patch_source(i);
      cols[size_t(i)] = from >= 0 ? xs[size_t(from)] : 0.0;
    }
    const Tensor cols_t = Tensor::from_vector<double>({rows, patch}, cols, Device::cpu());
    // dy's rows as CUDA gathers them: dy [N, OC, OH OW] permuted to [N, OH OW, OC].
    Tensor grads_t = Tensor::empty({rows, k.o}, DType::kFloat64, Device::cpu());
    Tensor permuted = grads_t.view({k.n, pixels, k.o});
    be.permute(dy.view({k.n, k.o, pixels}), {0, 2, 1}, permuted);
    for (const double beta : {0.0, 1.0}) {
      Tensor expected = dw0.clone(), no_bias;
      {
        cpu::ForcedConvAlgorithm force(cpu::ConvAlgorithm::kIm2col);
        be.conv2d_backward_filter(dy, x, k.g, beta, expected, no_bias);
      }
      Tensor lowered = dw0.clone();
      Tensor matrix = lowered.view({k.o, patch});
      be.gemm(true, false, 1.0, grads_t, cols_t, beta, matrix);
      EXPECT_LT(max_rel_error(lowered, expected), 1e-12) << k.str() << ", beta " << beta;
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

}  // namespace
}  // namespace accrue::testing
