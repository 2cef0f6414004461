// docs/data-path.md quotes the backend primitives of one micro-step and one boundary step of the
// default recipe. This test runs accrue-mnist as the document says (ACCRUE_TRACE=1, one step of
// 128 samples, on the CPU as the document's block is) on generated images of MNIST's shapes, cuts
// the same two parts out of the trace and compares them with the document's ```trace block line for
// line.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mnist_fixture.h"

namespace accrue::testing {
namespace {

std::vector<std::string> quoted_block(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> block;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == "```trace") {
      inside = true;
    } else if (inside && line == "```") {
      return block;
    } else if (inside) {
      block.push_back(line);
    }
  }
  ADD_FAILURE() << path << " has no closed ```trace block";
  return block;
}

// The window's start and its first micro-step (the seed's fill up to the next micro-step's
// gather_rows), and the boundary (the optimizer's norm_sq up to the one read,
// cast(float32[7] ...)).
std::vector<std::string> micro_step_and_boundary(const std::vector<std::string>& trace) {
  const auto find = [&](size_t from, const std::string& prefix) {
    for (size_t i = from; i < trace.size(); ++i) {
      if (trace[i].rfind(prefix, 0) == 0) return i;
    }
    ADD_FAILURE() << "no trace line starts with " << prefix << " after line " << from;
    return trace.size();
  };
  const size_t start = find(0, "fill(float32[] on cpu, 0.0078125)");
  const size_t second = find(find(start, "cross_entropy_backward("), "gather_rows(");
  const size_t boundary = find(second, "norm_sq(");
  const size_t report = find(boundary, "cast(float32[7]");
  std::vector<std::string> out(trace.begin() + start, trace.begin() + second);
  out.insert(out.end(), trace.begin() + boundary,
             trace.begin() + std::min(report + 1, trace.size()));
  return out;
}

TEST(DataPath, TheDocumentQuotesTheTraceOfTheDefaultRecipe) {
  const fs::path data = temp_dir("data-path");
  write_fixture(data, "train", 128, 1);
  write_fixture(data, "t10k", 100, 2);
  const fs::path trace_file = data / "trace.txt";
  const std::string command =
      std::string("ACCRUE_TRACE=1 '") + ACCRUE_MNIST_BINARY + "' --data '" + data.string() +
      "' --device cpu --max-steps 1 --train-limit 128 --quiet --threads 1 2> '" +
      trace_file.string() + "' > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(trace_file);
  std::vector<std::string> trace;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("[trace] ", 0) == 0) trace.push_back(line.substr(8));
  }
  const std::vector<std::string> ran = micro_step_and_boundary(trace);
  const std::vector<std::string> quoted =
      quoted_block(std::string(ACCRUE_SOURCE_DIR) + "/docs/data-path.md");
  ASSERT_FALSE(quoted.empty());
  for (size_t i = 0; i < std::max(ran.size(), quoted.size()); ++i) {
    EXPECT_EQ(i < ran.size() ? ran[i] : "(nothing)", i < quoted.size() ? quoted[i] : "(nothing)")
        << "line " << i + 1 << " of the ```trace block in docs/data-path.md differs from the run";
  }
  fs::remove_all(data);
}

}  // namespace
}  // namespace accrue::testing
