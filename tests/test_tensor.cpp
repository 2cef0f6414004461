// Tensor basics: factories, views sharing storage, copies, dtypes, devices.
#include <sstream>

#include "test_util.h"

namespace accrue::testing {
namespace {

TEST(Tensor, FactoriesAndMetadata) {
  Tensor z = Tensor::zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.dtype(), DType::kFloat32);
  EXPECT_EQ(z.device(), Device::cpu());
  EXPECT_EQ(z.nbytes(), 24u);
  EXPECT_EQ(z.describe(), "float32[2, 3] on cpu");
  EXPECT_EQ(full({2}, 1.5, DType::kFloat64).to_vector<double>(), (std::vector<double>{1.5, 1.5}));
  EXPECT_EQ(scalar(4.0).dim(), 0);
  EXPECT_DOUBLE_EQ(scalar(4.0).item(), 4.0);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector<float>({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor rows = t.narrow(1, 2);
  EXPECT_EQ(rows.shape(), (Shape{2, 2}));
  EXPECT_EQ(rows.to_vector<float>(), (std::vector<float>{2, 3, 4, 5}));
  fill_(rows, 9);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 9, 9, 9, 9}));
  Tensor flat = t.view({6});
  EXPECT_EQ(flat.raw(), t.raw());
  Tensor copy = t.clone();
  copy.zero_();
  EXPECT_EQ(t.to_vector<float>()[0], 0.0f);
  EXPECT_EQ(t.to_vector<float>()[2], 9.0f);
}

TEST(Tensor, CastsBetweenDtypes) {
  Tensor t = Tensor::from_vector<float>({3}, {1.5f, -2.0f, 3.25f});
  EXPECT_EQ(to_dtype(t, DType::kFloat64).to_vector<double>(),
            (std::vector<double>{1.5, -2.0, 3.25}));
  EXPECT_EQ(to_dtype(t, DType::kInt32).to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 3}));
}

// int64 holds counters PyTorch keeps in int64 (BatchNorm's num_batches_tracked): values past
// 2^32 survive from_vector, item, clone, fills, casts and device moves; arithmetic refuses it.
TEST(Tensor, Int64HoldsValuesPastInt32) {
  const int64_t big = (int64_t{1} << 40) + 3;
  Tensor t = Tensor::from_vector<int64_t>({3}, {big, -big, 7});
  EXPECT_EQ(t.dtype(), DType::kInt64);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.describe(), "int64[3] on cpu");
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{big, -big, 7}));
  EXPECT_EQ(t.clone().to_vector<int64_t>(), t.to_vector<int64_t>());
  EXPECT_DOUBLE_EQ(Tensor::from_vector<int64_t>({}, {big}).item(), static_cast<double>(big));
  Tensor counter = Tensor::zeros({}, DType::kInt64);
  fill_(counter, 4294967301.0);
  EXPECT_EQ(counter.to_vector<int64_t>()[0], 4294967301);
  EXPECT_EQ(to_dtype(t, DType::kFloat64).to_vector<double>(),
            (std::vector<double>{double(big), double(-big), 7}));
  EXPECT_EQ(
      to_dtype(Tensor::from_vector<int32_t>({2}, {-5, 9}), DType::kInt64).to_vector<int64_t>(),
      (std::vector<int64_t>{-5, 9}));
  EXPECT_EQ(
      to_dtype(Tensor::from_vector<float>({2}, {-2.5f, 3.75f}), DType::kInt64).to_vector<int64_t>(),
      (std::vector<int64_t>{-2, 3}));
  std::ostringstream printed;
  printed << t;
  EXPECT_EQ(printed.str(), "Tensor(int64[3] on cpu, [1099511627779, -1099511627779, 7])");
  for (Device device : devices()) {
    EXPECT_EQ(t.to(device).clone().to(Device::cpu()).to_vector<int64_t>(), t.to_vector<int64_t>())
        << device.str();
  }
  expect_error<DTypeError>([&] { t.to_vector<int32_t>(); }, {"int64", "int32"});
  expect_error<DTypeError>([&] { relu(t); }, {"[relu]", "int64"});
  expect_error<DTypeError>([&] { t.set_requires_grad(true); }, {"int64"});
}

TEST(Tensor, SetDataMovesEveryHandle) {
  Tensor a = Tensor::zeros({2});
  Tensor alias = a;
  Tensor b = full({2}, 7.0);
  a.set_data(b);
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{7, 7}));
  EXPECT_EQ(alias.raw(), b.raw());
}

TEST(Device, ParsesAndPrints) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  expect_error<std::invalid_argument>([] { Device::parse("gpu"); }, {"gpu", "cuda:N"});
  expect_error<std::invalid_argument>([] { Device::parse("cuda:x"); }, {"cuda:x"});
}

TEST(Device, CudaWithoutGpuIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_FALSE(cuda_unavailable_reason().empty());
  expect_error<DeviceError>([] { Tensor::zeros({2}, DType::kFloat32, Device::cuda(0)); },
                            {"cuda:0", "not available"});
  expect_error<DeviceError>([] { Tensor::zeros({2}).to(Device::cuda(0)); }, {"cuda:0"});
}

TEST(Device, MovesRoundTripThroughEveryDevice) {
  for (Device device : devices()) {
    Tensor t = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
    Tensor moved = t.to(device);
    EXPECT_EQ(moved.device(), device);
    EXPECT_EQ(moved.to(Device::cpu()).to_vector<float>(), t.to_vector<float>());
  }
}

}  // namespace
}  // namespace accrue::testing
