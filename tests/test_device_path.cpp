// The device path of a training window (DESIGN.md, "Backends"): a window waits for the device
// once, at the boundary's read (core/host_waits.h counts every wait through the runtime seam, and
// every host read on the CPU, so the count runs in CI); host-built micro-batches are staged
// without a wait (core/staging.h); the caching allocator's graph pool keeps what a CUDA graph
// captured (core/allocator.h); and on a GPU the micro-steps and the boundary replayed from CUDA
// graphs are the eager run, bit for bit (train/step_graphs.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "core/allocator.h"
#include "core/host_waits.h"
#include "core/staging.h"
#include "g2p.h"
#include "g2p_fixture.h"
#include "mnist_fixture.h"
#include "test_util.h"

namespace accrue::testing {
namespace {

// What the host waited for in each window of a run: the counts between one step's callback (or
// an epoch's end) and the next step's (the first from the start of training).
struct WindowWaits {
  std::vector<HostWaits> windows;
  std::vector<bool> epoch_first;  // the window opens an epoch (its order is copied before it)
  train::Summary summary;
};

template <typename Train>
WindowWaits count_waits(const Train& train) {
  WindowWaits w;
  train::Callbacks callbacks;
  HostWaits last = host_waits();
  bool first = true;
  callbacks.on_step = [&](const train::StepEvent&) {
    const HostWaits now = host_waits();
    w.windows.push_back(now - last);
    w.epoch_first.push_back(first);
    first = false;
    last = now;
  };
  // An epoch's end evaluates the model: not part of the next window.
  callbacks.on_epoch = [&](const train::EpochEvent&) {
    last = host_waits();
    first = true;
  };
  w.summary = train(callbacks);
  return w;
}

mnist::Config mnist_config(const fs::path& data, Device device, const std::string& model) {
  mnist::Config c;
  c.data = data.string();
  c.device = device;
  c.model = model;
  c.norm = model == "cnn" ? "group" : "none";
  c.hidden = {64, 32};
  c.epochs = 2;
  c.threads = 1;
  c.quiet = true;
  return c;
}

g2p::Config g2p_config(const std::string& dict, Device device) {
  g2p::Config c;
  c.data = dict;
  c.device = device;
  c.layers = 1;
  c.heads = 2;
  c.width = 8;
  c.epochs = 2;
  c.warmup = 0;
  c.eval = "validation";
  c.eval_limit = 4;
  c.threads = 1;
  c.quiet = true;
  return c;
}

// On the CPU a window reads the device once; on a GPU it also waits for the device once (the
// read's blocking copy) and, once its shapes are warm, nothing else: no synchronisation, no
// query, no cudaMalloc / cudaFree / cudaHostAlloc. The first window of an epoch is measured from
// the epoch's start, so it holds the copy of the epoch's order too; the run's first from the run's
// start (the data, the model).
void expect_one_wait_per_window(const WindowWaits& w, Device device, size_t warm,
                                const std::string& what) {
  ASSERT_GE(w.windows.size(), 4u) << what;
  for (size_t i = 0; i < w.windows.size(); ++i) {
    const HostWaits& h = w.windows[i];
    SCOPED_TRACE(what + " window " + std::to_string(i + 1) + ": " + h.str());
    EXPECT_EQ(h.reads, 1);
    if (device.is_cpu()) {
      EXPECT_EQ(h.device_waits(), 0);
    } else if (i > 0) {  // the first is measured from the start: data, model, optimizer
      EXPECT_EQ(h.blocking_copies, w.epoch_first[i] ? 2 : 1);
      EXPECT_EQ(h.synchronizations, 0);
      EXPECT_EQ(h.polls, 0);
      if (i >= warm) {
        EXPECT_EQ(h.system_memory, 0);
      }
    }
  }
  // The summary counts the same windows after the first.
  EXPECT_EQ(w.summary.windows_measured, static_cast<int64_t>(w.windows.size()) - 1) << what;
  EXPECT_EQ(w.summary.window_waits.reads, w.summary.windows_measured) << what;
}

class DevicePath : public ::testing::TestWithParam<Device> {};

TEST_P(DevicePath, AWindowWaitsForTheDeviceOnceMlpCnnAndG2P) {
  const Device device = GetParam();
  const fs::path data = make_dataset("device-path", 512, 64);
  for (const std::string model : {"mlp", "cnn"}) {
    const mnist::Config c = mnist_config(data, device, model);
    std::ostringstream out;
    const WindowWaits w = count_waits(
        [&](const train::Callbacks& callbacks) { return mnist::train(c, out, callbacks); });
    expect_one_wait_per_window(w, device, 2, model);
  }
  const fs::path dir = g2p_scratch("device-path");
  // Sequences of one length, 256 of them: every micro-batch is [32, T], so after two windows
  // every shape has been run and captured.
  g2p::Config fixed = g2p_config(write_g2p_fixture(dir, 300, 1, true), device);
  fixed.train_limit = 256;
  fixed.epochs = 3;
  std::ostringstream out;
  const WindowWaits w = count_waits(
      [&](const train::Callbacks& callbacks) { return g2p::train(fixed, out, callbacks); });
  expect_one_wait_per_window(w, device, 2, "g2p");
  // Lengths that vary: shapes keep arriving (each run eagerly, then captured), so memory may be
  // taken as they come, but a window still waits only for its read.
  const g2p::Config varied = g2p_config(write_g2p_fixture(dir, 300, 2, false), device);
  const WindowWaits v = count_waits(
      [&](const train::Callbacks& callbacks) { return g2p::train(varied, out, callbacks); });
  expect_one_wait_per_window(v, device, v.windows.size(), "g2p, varied lengths");
  fs::remove_all(dir);
  fs::remove_all(data);
}

INSTANTIATE_TEST_SUITE_P(Devices, DevicePath, ::testing::ValuesIn(devices()),
                         [](const auto& info) { return info.param.is_cpu() ? "cpu" : "cuda"; });

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// --cuda-graphs on against off on a GPU: the same steps and the same weights file, byte for byte,
// for the MLP, the GroupNorm CNN and G2P (varied lengths: a graph per shape); and the graphs did
// run: micro-steps replayed, and the MLP's constant-rate boundary too.
TEST(DevicePathGraphs, ReplayedRunsAreTheEagerRunBitForBit) {
  ACCRUE_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  const fs::path data = make_dataset("graphs", 512, 64);
  const fs::path dir = g2p_scratch("graphs");
  const std::string dict = write_g2p_fixture(dir, 300, 2, false);
  struct Runs {
    std::string what;
    std::function<train::Summary(train::CudaGraphs, const std::string& save,
                                 std::vector<double>& losses)>
        run;
  };
  const auto record = [](std::vector<double>& losses) {
    train::Callbacks c;
    c.on_step = [&losses](const train::StepEvent& e) { losses.push_back(e.loss); };
    return c;
  };
  std::vector<Runs> runs;
  for (const std::string model : {"mlp", "cnn"}) {
    runs.push_back({model, [&, model](train::CudaGraphs g, const std::string& save,
                                      std::vector<double>& losses) {
                      mnist::Config c = mnist_config(data, gpu, model);
                      c.cuda_graphs = g;
                      c.save = save;
                      std::ostringstream out;
                      return mnist::train(c, out, record(losses));
                    }});
  }
  runs.push_back(
      {"g2p", [&](train::CudaGraphs g, const std::string& save, std::vector<double>& losses) {
         g2p::Config c = g2p_config(dict, gpu);
         c.precision = train::Precision::kFp32;
         c.cuda_graphs = g;
         c.save = save;
         std::ostringstream out;
         return g2p::train(c, out, record(losses));
       }});
  for (const Runs& r : runs) {
    SCOPED_TRACE(r.what);
    const std::string eager_file = (dir / (r.what + "-eager.safetensors")).string();
    const std::string graph_file = (dir / (r.what + "-graphs.safetensors")).string();
    std::vector<double> eager_losses, graph_losses;
    const train::Summary eager = r.run(train::CudaGraphs::kOff, eager_file, eager_losses);
    const train::Summary graphed = r.run(train::CudaGraphs::kOn, graph_file, graph_losses);
    EXPECT_EQ(eager.graphs.replayed, 0);
    EXPECT_GT(graphed.graphs.replayed, 0);
    EXPECT_GT(graphed.graphs.graphs, 0);
    if (r.what == "mlp") {
      EXPECT_GT(graphed.graphs.boundaries_replayed, 0);
    }
    EXPECT_EQ(graph_losses, eager_losses);
    EXPECT_TRUE(file_bytes(graph_file) == file_bytes(eager_file))
        << graph_file << " and " << eager_file << " differ";
  }
  fs::remove_all(dir);
  fs::remove_all(data);
}

// Staging: the tensor arrives whole; on a GPU neither stage() nor ready() waits for the device
// once the pinned and device pools hold blocks of the size.
TEST(Staging, HostTensorsArriveWithoutAWait) {
  for (const Device device : devices()) {
    SCOPED_TRACE(device.str());
    HostToDevice stager(device);
    const auto host = [](int32_t first) {
      std::vector<int32_t> v(1000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = first + static_cast<int32_t>(i);
      return Tensor::from_vector<int32_t>({10, 100}, v);
    };
    for (int round = 0; round < 3; ++round) {
      const HostWaits before = host_waits();
      HostToDevice::Pending a = stager.stage(host(round));
      HostToDevice::Pending b = stager.stage(host(100 * round));  // one ahead
      const Tensor ta = stager.ready(a), tb = stager.ready(b);
      const HostWaits during = host_waits() - before;
      if (round > 0) {
        EXPECT_EQ(during.device_waits(), 0) << during.str();
      }
      EXPECT_EQ(ta.device(), device);
      EXPECT_EQ(ta.to_vector<int32_t>(), host(round).to_vector<int32_t>());
      EXPECT_EQ(tb.to_vector<int32_t>(), host(100 * round).to_vector<int32_t>());
      stager.release_waited();
    }
  }
}

// The graph pool, on a host allocator (the bookkeeping is the device's): what a capture was given
// or freed is never handed out again outside a capture, survives empty_cache(), and is what the
// next capture takes first.
TEST(GraphPool, BlocksOfACaptureStayWithTheGraphs) {
  SystemMemory host{[](size_t n, int) { return std::aligned_alloc(64, n); },
                    [](void* p, int) { std::free(p); }, [](int) { return std::string(); }};
  CachingAllocator alloc(Device::cpu(), host);
  void* before = alloc.allocate(4096);  // allocated before, freed during the capture
  alloc.begin_graph_capture();
  void* inside = alloc.allocate(4096);
  alloc.deallocate(inside);
  alloc.deallocate(before);
  EXPECT_EQ(alloc.stats().graph_bytes, 2 * 4096u);
  EXPECT_EQ(alloc.end_graph_capture(), 0u);
  // Outside a capture neither block comes back.
  void* outside = alloc.allocate(4096);
  EXPECT_NE(outside, inside);
  EXPECT_NE(outside, before);
  alloc.deallocate(outside);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().graph_bytes, 2 * 4096u);
  EXPECT_EQ(alloc.stats().reserved_bytes, 2 * 4096u);
  // The next capture takes them first.
  alloc.begin_graph_capture();
  void* again = alloc.allocate(4000);
  EXPECT_TRUE(again == inside || again == before);
  alloc.deallocate(again);
  EXPECT_EQ(alloc.end_graph_capture(), 0u);
  EXPECT_EQ(alloc.stats().graph_bytes, 2 * 4096u);
  // A block given during a capture and still live at its end is counted: the capture fails.
  alloc.begin_graph_capture();
  void* kept = alloc.allocate(1024);
  EXPECT_EQ(alloc.end_graph_capture(), 1u);
  alloc.deallocate(kept);
  expect_error<std::logic_error>(
      [&] {
        alloc.begin_graph_capture();
        alloc.begin_graph_capture();
      },
      {"already"});
}

}  // namespace
}  // namespace accrue::testing
