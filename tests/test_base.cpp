// The base layer on its own: this executable links accrue::core and nothing above it, so a base
// file that needed a kernel, an op or the tape would fail to link here. It checks what the base
// promises by itself: byte copies, zeros, views, host conversions and the allocator statistics.
#include <gtest/gtest.h>

#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "core/tensor.h"

namespace accrue {
namespace {

TEST(Base, ZerosCopiesAndViewsMoveBytesOnly) {
  const Tensor z = Tensor::zeros({2, 3}, DType::kFloat64);
  EXPECT_EQ(z.to_vector<double>(), std::vector<double>(6, 0.0));
  const Tensor a = Tensor::from_vector<float>({2, 2}, {1.5f, -2.0f, 3.25f, 4.0f});
  Tensor b = a.clone();
  EXPECT_FALSE(b.same(a));
  EXPECT_EQ(b.to_vector<float>(), a.to_vector<float>());
  b.narrow(1, 1).zero_();
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 0.0f, 0.0f}));
  Tensor c = Tensor::empty({4}, DType::kFloat32);
  c.copy_(a.view({4}));
  EXPECT_EQ(c.to_vector<float>(), a.to_vector<float>());
  EXPECT_EQ(a.view({4}).narrow(2, 1).item(), 3.25);
  const Tensor h = Tensor::from_vector<bf16>({1}, {bf16(1.0f)});
  EXPECT_EQ(h.item(), 1.0);
}

TEST(Base, CopiesCheckShapesAndVersionsCountWrites) {
  Tensor a = Tensor::zeros({3});
  const uint64_t v = a.impl()->storage->version();
  a.zero_();
  EXPECT_EQ(a.impl()->storage->version(), v + 1);
  EXPECT_THROW(a.copy_(Tensor::zeros({4})), ShapeError);
  EXPECT_THROW(a.copy_(Tensor::zeros({3}, DType::kFloat64)), ShapeError);
}

TEST(Base, TheAllocatorCountsLiveBytes) {
  CachingAllocator& alloc = allocator_for(Device::cpu());
  const size_t before = alloc.stats().live_bytes;
  {
    const Tensor t = Tensor::zeros({1024}, DType::kFloat64);
    EXPECT_GE(alloc.stats().live_bytes, before + 8192);
  }
  EXPECT_EQ(alloc.stats().live_bytes, before);
}

}  // namespace
}  // namespace accrue
