// Order-exact contracts of the pooling, ReLU-bias and norm kernels on every device and floating
// type, bit for bit: max pooling keeps the first maximum and the first NaN, its backward adds in
// order and skips the unrouted outputs, the fused ReLU-bias backward gives its two primitives'
// bytes, and the CPU norms give each group, row and channel the bytes it gets alone.
#include <cstring>
#include <tuple>

#include "kernels/backend.h"
#include "test_util.h"

namespace accrue::testing {
namespace {

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
