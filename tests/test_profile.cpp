// ACCRUE_PROFILE (kernels/profile.h): the profiler's call counts are the trace's. accrue-mnist runs
// two steps with ACCRUE_TRACE=1 and ACCRUE_PROFILE=1 together; every primitive the trace printed
// must appear in the profile table with as many calls, and in the Chrome trace file as many
// events. In process: a profiling backend records exactly the calls made through it, under the
// innermost ProfileScope.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/profile.h"
#include "mnist_fixture.h"

namespace accrue::testing {
namespace {

TEST(Profile, CallCountsMatchTheTraceAndTheChromeTraceFile) {
  const fs::path data = temp_dir("profile");
  write_fixture(data, "train", 128, 1);
  write_fixture(data, "t10k", 100, 2);
  const fs::path log = data / "stderr.txt", json = data / "profile.json";
  const std::string command =
      "ACCRUE_TRACE=1 ACCRUE_PROFILE=1 ACCRUE_PROFILE_JSON='" + json.string() + "' '" +
      ACCRUE_MNIST_BINARY + "' --data '" + data.string() +
      "' --max-steps 2 --train-limit 128 --quiet --threads 1 2> '" + log.string() + "' > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::map<std::string, int64_t> traced, profiled, events;
  std::ifstream in(log);
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("[trace] ", 0) == 0) {
      ++traced[line.substr(8, line.find('(') - 8)];
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
}

}  // namespace
}  // namespace accrue::testing
