// ACCRUE_PROFILE (kernels/profile.h): the profiler's call counts are the trace's. accrue-mnist runs
// two steps with ACCRUE_TRACE=1 and ACCRUE_PROFILE=1 together; every primitive the trace printed
// must appear in the profile table with as many calls, and in the Chrome trace file as many
// events. In process: a profiling backend records exactly the calls made through it, under the
// innermost ProfileScope; timed by a device's marks (CUDA's events; here a simulated device whose
// clock ticks once per mark), each call is read once the device has passed it, with the time
// between its own two marks.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/profile.h"
#include "mnist_fixture.h"
#include "ops/autograd.h"
#include "ops/ops.h"
#include "test_util.h"

namespace accrue::testing {
namespace {

// On a GPU the run is eager (--cuda-graphs off): a replayed graph is one profiled call, while the
// trace sees the primitives only when they are captured (the device-path tests cover graphs).
TEST(Profile, CallCountsMatchTheTraceAndTheChromeTraceFile) {
  const fs::path data = temp_dir("profile");
  write_fixture(data, "train", 128, 1);
  write_fixture(data, "t10k", 100, 2);
  const fs::path log = data / "stderr.txt", json = data / "profile.json";
  const std::string command =
      "ACCRUE_TRACE=1 ACCRUE_PROFILE=1 ACCRUE_PROFILE_JSON='" + json.string() + "' '" +
      ACCRUE_MNIST_BINARY + "' --data '" + data.string() +
      "' --max-steps 2 --train-limit 128 --quiet --threads 1 --cuda-graphs off 2> '" +
      log.string() + "' > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::map<std::string, int64_t> traced, profiled, events;
  std::ifstream in(log);
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("[trace] ", 0) == 0) {
      // The profile names the op of the primitives that take one: "[trace] unary(tanh, ...)"
      // is the row "unary:tanh".
      const size_t open = line.find('(');
      std::string name = line.substr(8, open - 8);
      if (name == "unary" || name == "unary_backward" || name == "binary") {
        name += ":" + line.substr(open + 1, line.find(',', open) - open - 1);
      }
      ++traced[name];
    } else if (line.rfind("primitive ", 0) == 0) {
      in_table = true;
    } else if (line.rfind("scope ", 0) == 0) {
      in_table = false;
    } else if (in_table) {
      std::istringstream row(line);
      std::string name;
      int64_t calls = 0;
      row >> name >> calls;
      profiled[name] = calls;
    }
  }
  ASSERT_FALSE(traced.empty());
  EXPECT_EQ(profiled, traced);
  std::ifstream trace_file(json);
  const nlohmann::json trace = nlohmann::json::parse(trace_file);
  for (const auto& e : trace["traceEvents"]) {
    ++events[e["name"].get<std::string>()];
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0.0);
  }
  EXPECT_EQ(events, traced);
  EXPECT_EQ(trace["otherData"]["dropped_events"], 0);
  fs::remove_all(data);
}

// The engine's --profile does what ACCRUE_PROFILE=1 does: the tables on stderr at exit, with a
// registered module's forward as a scope of its own.
TEST(Profile, TheEnginesProfileFlagPrintsTheTables) {
  const fs::path data = temp_dir("profile_flag");
  write_fixture(data, "train", 128, 1);
  write_fixture(data, "t10k", 100, 2);
  const fs::path log = data / "stderr.txt";
  const std::string command =
      "env -u ACCRUE_PROFILE '" + std::string(ACCRUE_MNIST_BINARY) + "' --data '" + data.string() +
      "' --max-steps 2 --train-limit 128 --quiet --threads 1 --profile 2> '" + log.string() +
      "' > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("primitive "), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("linear_forward "), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("scope (module forward, backward node)"), std::string::npos)
      << text.str();
  // The MLP's hidden layers (fused Linear + ReLU) and its last Linear, each under its own path.
  for (const char* scope : {"forward layers.0 ", "forward layers.2 ", "forward layers.3 "}) {
    EXPECT_NE(text.str().find(scope), std::string::npos) << scope << " in\n" << text.str();
  }
}

// ACCRUE_PROFILE_JSON is one of the run's outputs: the same file as another output, or a folder,
// is a mistake found before the data is read (exit 2, one line, nothing overwritten); a trace that
// cannot be written at exit makes the run's status 1. One row per case.
TEST(Profile, TheTracePathIsCheckedLikeEveryOutput) {
  const fs::path data = temp_dir("profile_path");
  write_fixture(data, "train", 128, 1);
  write_fixture(data, "t10k", 100, 2);
  const fs::path weights = data / "weights.safetensors";
  {
    std::ofstream keep(weights);
    keep << "the previous weights";
  }
  struct Row {
    std::string trace, extra;
    int status;
    std::string words;
  };
  const std::vector<Row> rows{
      {weights.string(), "--save '" + weights.string() + "'", 2, "ACCRUE_PROFILE_JSON"},
      {data.string(), "", 2, "ACCRUE_PROFILE_JSON"},
      {"/dev/full", "", 1, "/dev/full"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.trace);
    const fs::path log = data / "stderr.txt";
    const std::string command = "ACCRUE_PROFILE_JSON='" + row.trace + "' '" +
                                std::string(ACCRUE_MNIST_BINARY) + "' --data '" + data.string() +
                                "' --max-steps 1 --train-limit 128 --quiet --threads 1 --profile " +
                                row.extra + " 2> '" + log.string() + "' > /dev/null";
    const int raw = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(raw)) << command;
    EXPECT_EQ(WEXITSTATUS(raw), row.status) << command;
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NE(text.str().find(row.words), std::string::npos) << text.str();
  }
  std::ifstream kept(weights);
  std::string first;
  std::getline(kept, first);
  EXPECT_EQ(first, "the previous weights");
  fs::remove_all(data);
}

TEST(Profile, RecordsEachCallUnderItsInnermostScope) {
  auto backend = make_profiling_backend(backend_for(Device::cpu()), Device::cpu());
  clear_profile();
  Tensor t = Tensor::zeros({256}, DType::kFloat32);
  backend->fill(t, 1.0);
  {
    const ProfileScope outer("outer");
    backend->fill(t, 2.0);
    {
      const ProfileScope inner("inner");
      backend->fill(t, 3.0);
      backend->fill(t, 4.0);
    }
    backend->fill(t, 5.0);
  }
  EXPECT_EQ(t.to_vector<float>()[0], 5.0f);  // forwarded
  const ProfileTotals totals = profile_totals();
  ASSERT_EQ(totals.primitives.size(), 1u);
  EXPECT_EQ(totals.primitives[0].name, "fill");
  EXPECT_EQ(totals.primitives[0].calls, 5);
  EXPECT_EQ(totals.primitives[0].bytes, 5 * 256 * 4.0);
  EXPECT_EQ(totals.primitives[0].flops, 0.0);  // not a GEMM
  EXPECT_TRUE(totals.host.empty());            // on the CPU a call's time is the host's
  std::map<std::string, int64_t> scopes;
  for (const ProfileRow& r : totals.scopes) scopes[r.name] = r.calls;
  EXPECT_EQ(scopes,
            (std::map<std::string, int64_t>{{"forward/other", 1}, {"outer", 2}, {"inner", 2}}));
  clear_profile();
  // A GEMM's FLOPs from its shapes: c [4, 5] = a^T [4, 3] b [3, 5] is 2 x 4 x 5 x 3.
  Tensor a = Tensor::zeros({3, 4}, DType::kFloat32), b = Tensor::zeros({3, 5}, DType::kFloat32);
  Tensor c = Tensor::zeros({4, 5}, DType::kFloat32);
  backend->gemm(true, false, 1.0, a, b, 0.0, c);
  EXPECT_EQ(profile_totals().primitives.at(0).flops, 120.0);
  clear_profile();
  // A convolution pass counts the direct convolution's multiply-adds: y [2, 4, 3, 3] from a
  // [4, 3, 3, 3] filter is 2 x 72 x 27 in each of the three passes.
  Tensor x = Tensor::zeros({2, 3, 5, 5}, DType::kFloat32), w = Tensor::zeros({4, 3, 3, 3});
  Tensor y = Tensor::zeros({2, 4, 3, 3}), dx = x.clone(), dw = w.clone(), bias;
  backend->conv2d_forward(x, w, bias, Conv2dGeometry{}, y);
  backend->conv2d_backward_data(y, w, Conv2dGeometry{}, dx);
  backend->conv2d_backward_filter(y, x, Conv2dGeometry{}, 0.0, dw, bias);
  for (const ProfileRow& r : profile_totals().primitives)
    EXPECT_EQ(r.flops, 2 * 72 * 27.0) << r.name;
  EXPECT_EQ(profile_totals().primitives.size(), 3u);
  clear_profile();
  // The primitives that take an op are named with it; layer norm's tape node is layer_norm's,
  // though it runs the group_norm primitive.
  Tensor v = Tensor::zeros({2, 3});
  backend->unary(UnaryOp::kTanh, v, v);
  backend->unary_backward(UnaryOp::kTanh, v, v, v);
  backend->binary(BinaryOp::kMul, v, v, v);
  std::set<std::string> names;
  for (const ProfileRow& r : profile_totals().primitives) names.insert(r.name);
  EXPECT_EQ(names, (std::set<std::string>{"unary:tanh", "unary_backward:tanh", "binary:mul"}));
  clear_profile();
}

// The backward scopes are the tape nodes' names: layer norm's is layer_norm (it runs the
// group_norm primitive), tanh's is tanh. In a child process: profiling, once enabled, stays on.
TEST(Profile, BackwardScopesNameTheOp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto scopes_of_a_backward = [] {
    enable_profile();
    Tensor x = full({2, 3}, 1.0), scale = full({3}, 1.0), shift = Tensor::zeros({3});
    x.set_requires_grad(true), scale.set_requires_grad(true);
    backward(sum(tanh(layer_norm(x, scale, shift, 1e-5))));
    std::set<std::string> scopes;
    for (const ProfileRow& r : profile_totals().scopes) scopes.insert(r.name);
    const bool named = scopes.count("layer_norm") == 1 && scopes.count("tanh") == 1 &&
                       scopes.count("group_norm") == 0;
    std::string list;
    for (const std::string& s : scopes) list += s + "; ";
    std::fprintf(stderr, "scopes: %s\n", list.c_str());
    std::_Exit(named ? 0 : 1);
  };
  EXPECT_EXIT(scopes_of_a_backward(), ::testing::ExitedWithCode(0), "scopes: ");
}

// A device whose clock reads 1 ms more at each mark, and which has passed the marks below
// `reached_below` (a wait passes the mark waited for). It counts the marks in use.
struct SimulatedDevice {
  int64_t recorded = 0, reached_below = 0, waits = 0;
  std::set<int64_t> in_use;
  bool broken = false;  // every read fails, as a device whose runtime has shut down
};
class SimulatedMarks final : public DeviceMarks {
 public:
  explicit SimulatedMarks(SimulatedDevice& device) : d_(device) {}
  Mark record() override {
    d_.in_use.insert(d_.recorded);
    return as_mark(d_.recorded++);
  }
  bool reached(Mark m) override {
    if (d_.broken) throw std::runtime_error("the simulated device is gone");
    return index(m) < d_.reached_below;
  }
  double seconds_between(Mark start, Mark stop) override {
    if (!reached(stop)) {
      ++d_.waits;
      d_.reached_below = index(stop) + 1;
    }
    return 1e-3 * static_cast<double>(index(stop) - index(start));
  }
  void release(Mark m) override { EXPECT_EQ(d_.in_use.erase(index(m)), 1u) << index(m); }

 private:
  static Mark as_mark(int64_t i) { return reinterpret_cast<Mark>(static_cast<intptr_t>(i + 1)); }
  static int64_t index(Mark m) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(m)) - 1; }
  SimulatedDevice& d_;
};

// A profiling backend over the CPU's, timed by a simulated device on the trace's row `timeline`,
// the profile cleared.
std::unique_ptr<Backend> simulated_backend(SimulatedDevice& device, int timeline) {
  clear_profile();
  return make_profiling_backend(backend_for(Device::cpu()),
                                std::make_unique<SimulatedMarks>(device), timeline);
}

TEST(Profile, DeviceMarkedCallsAreReadOnceTheDeviceHasPassedThem) {
  SimulatedDevice device;
  auto backend = simulated_backend(device, 1007);
  Tensor t = Tensor::zeros({64}, DType::kFloat32);
  {
    const ProfileScope scope("layer");  // gone before the calls are read
    backend->fill(t, 1.0);
    backend->fill(t, 2.0);
  }
  backend->fill(t, 3.0);
  // marks 0 (the origin), then 1-2, 3-4, 5-6: nothing passed yet, so nothing read or waited for
  EXPECT_EQ(device.recorded, 7);
  EXPECT_EQ(device.in_use.size(), 7u);
  device.reached_below = 5;  // the first two calls are done; the next call reads them
  backend->fill(t, 4.0);
  // call 2's start (kept: the next call's place on the trace is counted from it), calls 3 and 4
  EXPECT_EQ(device.in_use, (std::set<int64_t>{3, 5, 6, 7, 8}));
  EXPECT_EQ(device.waits, 0);
  const ProfileTotals totals = profile_totals();  // reads the rest, waiting for the device
  EXPECT_EQ(device.waits, 2);
  EXPECT_EQ(device.in_use, std::set<int64_t>{7});  // all released but the last call's start
  ASSERT_EQ(totals.primitives.size(), 1u);
  EXPECT_EQ(totals.primitives[0].calls, 4);
  EXPECT_NEAR(totals.primitives[0].seconds, 4e-3, 1e-12);  // 1 ms between each call's marks
  std::map<std::string, int64_t> scopes;
  for (const ProfileRow& r : totals.scopes) scopes[r.name] = r.calls;
  EXPECT_EQ(scopes, (std::map<std::string, int64_t>{{"layer", 2}, {"forward/other", 2}}));
  // The host's own time inside each call (here the CPU's fill), in a table of its own.
  ASSERT_EQ(totals.host.size(), 1u);
  EXPECT_EQ(totals.host[0].name, "fill");
  EXPECT_EQ(totals.host[0].calls, 4);
  EXPECT_GT(totals.host[0].seconds, 0.0);
  EXPECT_EQ(totals.host_seconds, totals.host[0].seconds);
  std::ostringstream printed;
  print_profile(printed);
  EXPECT_NE(printed.str().find("of host time inside the device calls"), std::string::npos)
      << printed.str();
  // On the trace, the calls lie on row 1007, 2 ms apart on the device's clock.
  const fs::path dir = temp_dir("profile_marks"), json = dir / "trace.json";
  write_profile_trace(json.string());
  std::ifstream in(json);
  const nlohmann::json trace = nlohmann::json::parse(in);
  ASSERT_EQ(trace["traceEvents"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const auto& e = trace["traceEvents"][i];
    EXPECT_EQ(e["tid"], 1007);
    EXPECT_NEAR(e["dur"].get<double>(), 1000.0, 1e-3);  // microseconds
    if (i > 0) {
      EXPECT_NEAR(e["ts"].get<double>() - trace["traceEvents"][i - 1]["ts"].get<double>(), 2000.0,
                  1e-3);
    }
  }
  fs::remove_all(dir);
  clear_profile();
}

TEST(Profile, TheDeviceQueueIsBounded) {
  SimulatedDevice device;
  auto backend = simulated_backend(device, 1000);
  Tensor t = Tensor::zeros({1}, DType::kFloat32);
  for (int i = 0; i < 5000; ++i) backend->fill(t, 1.0);  // the device never catches up by itself
  // Past 4096 queued calls each new call waits for the oldest one.
  EXPECT_EQ(device.waits, 5000 - 4096);
  EXPECT_EQ(device.in_use.size(), 1 + 2 * 4096u);
  backend.reset();  // a backend reads its queue as it goes
  EXPECT_EQ(device.in_use.size(), 1u);
  EXPECT_EQ(profile_totals().primitives.at(0).calls, 5000);
  clear_profile();
}

TEST(Profile, ACallThatThrowsGivesItsMarkBack) {
  SimulatedDevice device;
  auto backend = simulated_backend(device, 1000);
  Tensor labels = Tensor::zeros({4}, DType::kInt32), out = Tensor::zeros({1}, DType::kInt32);
  EXPECT_THROW(backend->sum_all(labels, out), DTypeError);  // a sum of integers
  EXPECT_EQ(device.in_use, std::set<int64_t>{0});           // only the first mark
  backend.reset();
  EXPECT_TRUE(profile_totals().primitives.empty());
  clear_profile();
}

TEST(Profile, CallsOfADeviceThatCannotBeReadAreCountedAsMissing) {
  SimulatedDevice device;
  auto backend = simulated_backend(device, 1000);
  Tensor t = Tensor::zeros({1}, DType::kFloat32);
  backend->fill(t, 1.0);
  backend->fill(t, 2.0);
  device.broken = true;
  EXPECT_THROW(profile_totals(), std::runtime_error);  // a device error is an error
  backend.reset();  // ... but going, the backend counts what it could not read
  std::ostringstream out;
  print_profile(out);
  EXPECT_NE(out.str().find("2 device calls are missing"), std::string::npos) << out.str();
  clear_profile();
  std::ostringstream cleared;
  print_profile(cleared);
  EXPECT_EQ(cleared.str().find("missing"), std::string::npos) << cleared.str();
}

// On a GPU, the calls are timed by CUDA events: every call is read, with a positive time on the
// device's own row of the trace.
TEST(Profile, CudaCallsAreTimedByEventsOnTheDevicesRow) {
  ACCRUE_REQUIRE_CUDA();
  clear_profile();
  const Device gpu = Device::cuda(0);
  {
    auto backend = make_profiling_backend(backend_for(gpu), gpu);
    Tensor t = Tensor::zeros({1 << 20}, DType::kFloat32, gpu);
    for (int i = 0; i < 3; ++i) backend->fill(t, i);
    EXPECT_EQ(t.to(Device::cpu()).to_vector<float>()[0], 2.0f);
  }
  const ProfileTotals totals = profile_totals();
  ASSERT_EQ(totals.primitives.size(), 1u);
  EXPECT_EQ(totals.primitives[0].calls, 3);
  EXPECT_GT(totals.primitives[0].seconds, 0.0);
  ASSERT_EQ(totals.host.size(), 1u);  // each launch's host time beside the device's
  EXPECT_EQ(totals.host[0].calls, 3);
  const fs::path dir = temp_dir("profile_cuda"), json = dir / "trace.json";
  write_profile_trace(json.string());
  std::ifstream in(json);
  const nlohmann::json trace = nlohmann::json::parse(in);
  ASSERT_EQ(trace["traceEvents"].size(), 3u);
  for (const auto& e : trace["traceEvents"]) EXPECT_EQ(e["tid"], 1000);
  fs::remove_all(dir);
  clear_profile();
}

// Without a GPU, a CUDA device's profiler cannot be made, and says why.
TEST(Profile, ACudaDeviceThatIsNotThereIsADeviceError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  try {
    make_profiling_backend(backend_for(Device::cpu()), Device::cuda(0));
    ADD_FAILURE() << "no error";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find(cuda_unavailable_reason()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace accrue::testing
