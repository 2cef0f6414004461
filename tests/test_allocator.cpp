// The caching allocator: block reuse, exact statistics, emptying the cache, and the loop
// invariants training relies on (no system allocation after the first iteration, live bytes
// back to baseline after every backward). Runs on every device present.
#include <limits>

#include "test_util.h"

namespace accrue::testing {
namespace {

constexpr size_t kG = CachingAllocator::kGranule;

class AllocatorTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) ACCRUE_REQUIRE_CUDA();
  }
};

// The pooling logic is the same for every device; it is checked here over host memory.
TEST(Allocator, ReusesFreedBlocksAndCountsExactly) {
  CachingAllocator alloc(Device::cpu(), {[](size_t n, int) { return std::aligned_alloc(64, n); },
                                         [](void* p, int) { std::free(p); },
                                         [](int) { return std::string("test memory"); }});
  void* a = alloc.allocate(3 * kG);
  void* b = alloc.allocate(kG + 1);  // rounds up to 2 granules
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.live_bytes, 5 * kG);
  EXPECT_EQ(s.peak_bytes, 5 * kG);
  EXPECT_EQ(s.reserved_bytes, 5 * kG);
  EXPECT_EQ(s.system_allocs, 2);
  alloc.deallocate(a);
  s = alloc.stats();
  EXPECT_EQ(s.live_bytes, 2 * kG);
  EXPECT_EQ(s.cached_bytes, 3 * kG);
  EXPECT_EQ(s.reserved_bytes, 5 * kG);
  void* c = alloc.allocate(3 * kG);
  EXPECT_EQ(c, a) << "a freed block of the same size must be reused";
  EXPECT_EQ(alloc.stats().system_allocs, 2);
  EXPECT_EQ(alloc.stats().pool_hits, 1);
  // A cached block more than twice the request is not used for it.
  alloc.deallocate(c);
  void* d = alloc.allocate(kG);
  EXPECT_NE(d, a);
  EXPECT_EQ(alloc.stats().system_allocs, 3);
  alloc.reset_peak();
  EXPECT_EQ(alloc.stats().peak_bytes, 3 * kG);
  // A request served by a larger pooled block counts its own (rounded) size as live.
  void* e = alloc.allocate(2 * kG);
  EXPECT_EQ(e, a);
  EXPECT_EQ(alloc.stats().live_bytes, 5 * kG);
  EXPECT_EQ(alloc.stats().reserved_bytes, 6 * kG);
  alloc.deallocate(e);
  alloc.deallocate(b);
  alloc.deallocate(d);
  EXPECT_EQ(alloc.stats().live_bytes, 0u);
  alloc.empty_cache();
  s = alloc.stats();
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.system_frees, 3);
  EXPECT_EQ(alloc.allocate(0), nullptr);
  EXPECT_THROW(alloc.deallocate(reinterpret_cast<void*>(0x40)), std::logic_error);
}

// Out of memory: the pool is given back and the request retried once; then the error names the
// device, the request, the live and reserved bytes and what the system said.
TEST(Allocator, OutOfMemoryReleasesThePoolRetriesOnceThenNamesTheSizes) {
  static int system_allocs = 0;
  static size_t held = 0;
  const SystemMemory tight{[](size_t n, int) -> void* {
                             ++system_allocs;
                             if (held + n > 8 * kG) return nullptr;
                             held += n;
                             return std::aligned_alloc(64, n);
                           },
                           [](void* p, int) {
                             held -= kG;  // every block below is one granule
                             std::free(p);
                           },
                           [](int) { return std::string("the test system has 8 granules"); }};
  CachingAllocator alloc(Device::cpu(), tight);
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(alloc.allocate(kG));
  alloc.deallocate(blocks.back());  // one granule pooled
  blocks.pop_back();
  system_allocs = 0;
  // Needs two granules: the pooled one is too small, the system refuses, the pool goes back,
  // the retry still fails (7 live + 2 > 8).
  expect_error<OutOfMemoryError>([&] { alloc.allocate(2 * kG); },
                                 {"[allocator] cpu", "1024 bytes", "3584 bytes live",
                                  "3584 reserved", "the test system has 8 granules"});
  EXPECT_EQ(system_allocs, 2) << "one try, one retry after releasing the pool";
  EXPECT_EQ(alloc.stats().cached_bytes, 0u);
  for (void* p : blocks) alloc.deallocate(p);
  alloc.empty_cache();
}

// A request near the top of size_t would round up past it to a small block: it is refused before
// the system or the pool is asked, and the statistics stay as they were. A tensor of such a
// size is refused the same way instead of being handed a block it would overrun.
TEST(Allocator, RequestsBeyondAnyMemoryAreRefusedBeforeTheyRoundAround) {
  CachingAllocator& alloc = allocator_for(Device::cpu());
  const AllocatorStats before = alloc.stats();
  for (size_t n : {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() - 8,
                   std::numeric_limits<size_t>::max() / 2 + 1}) {
    expect_error<OutOfMemoryError>([&] { alloc.allocate(n); },
                                   {"[allocator] cpu", std::to_string(n), "exceeds any memory"});
  }
  expect_error<OutOfMemoryError>([] { Tensor::zeros({(int64_t{1} << 61) - 1}, DType::kFloat64); },
                                 {"exceeds any memory"});
  const AllocatorStats after = alloc.stats();
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_EQ(after.system_allocs, before.system_allocs);
  EXPECT_EQ(after.allocs, before.allocs);
}

TEST_P(AllocatorTest, DeviceAllocatorTracksTensors) {
  CachingAllocator& alloc = allocator_for(GetParam());
  const AllocatorStats before = alloc.stats();
  {
    Tensor t = Tensor::empty({1024}, DType::kFloat32, GetParam());  // 4096 bytes
    EXPECT_EQ(alloc.stats().live_bytes, before.live_bytes + 4096);
  }
  EXPECT_EQ(alloc.stats().live_bytes, before.live_bytes);
  const int64_t system = alloc.stats().system_allocs;
  { Tensor t = Tensor::empty({1024}, DType::kFloat32, GetParam()); }
  EXPECT_EQ(alloc.stats().system_allocs, system) << "the second tensor must come from the pool";
}

// A repeated forward/backward loop over one model takes nothing from the system after its
// first iteration, and live bytes return to the same baseline after every backward.
TEST_P(AllocatorTest, TrainingLoopReachesSteadyState) {
  const Device device = GetParam();
  nn::manual_seed(1);
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(20, 32));
  model.add(std::make_shared<nn::ReLU>());
  model.add(std::make_shared<nn::Linear>(32, 5));
  model.to(device);
  optim::ParameterArena arena(model);
  optim::Adam adam(arena);
  Tensor x = random({16, 20}, 3, DType::kFloat32).to(device);
  std::vector<int32_t> l(16);
  for (int i = 0; i < 16; ++i) l[i] = i % 5;
  Tensor labels = Tensor::from_vector<int32_t>({16}, l, device);
  CachingAllocator& alloc = allocator_for(device);
  size_t baseline = 0;
  int64_t system_after_first = 0;
  for (int iter = 0; iter < 5; ++iter) {
    backward(cross_entropy(model(x), labels), 1.0 / 16);
    adam.step(1.0);
    EXPECT_EQ(tape_size(), 0u);
    if (iter == 0) {
      baseline = alloc.stats().live_bytes;
      system_after_first = alloc.stats().system_allocs;
    } else {
      EXPECT_EQ(alloc.stats().live_bytes, baseline) << "iteration " << iter;
      EXPECT_EQ(alloc.stats().system_allocs, system_after_first) << "iteration " << iter;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, AllocatorTest, ::testing::Values(Device::cpu(), Device::cuda(0)),
                         [](const auto& info) { return info.param.is_cpu() ? "cpu" : "cuda"; });

}  // namespace
}  // namespace accrue::testing
