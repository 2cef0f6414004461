// Fixtures of the MNIST trainer tests, made on the spot (no network): a learnable stand-in for
// the IDX files, a scratch folder per test, and a driver for the command line.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/file.h"
#include "dataset.h"
#include "idx.h"
#include "mnist.h"
#include "test_util.h"

namespace accrue::testing {

namespace fs = std::filesystem;
using mnist::IdxImages;

// A run's summary with its per-step records, gathered through the engine's step callback.
struct Recorded : train::Summary {
  double test_accuracy = 0;
  std::vector<double> step_losses, step_grad_norms, step_loss_scales;
  std::vector<int64_t> step_batches;  // the effective batch of every step (its window's samples)
};

inline Recorded train_recorded(const mnist::Config& config, std::ostream& out) {
  Recorded r;
  train::Callbacks callbacks;
  callbacks.on_step = [&](const train::StepEvent& e) {
    r.step_losses.push_back(e.loss);
    r.step_grad_norms.push_back(e.grad_norm);
    r.step_loss_scales.push_back(e.loss_scale);
    r.step_batches.push_back(e.samples);
  };
  static_cast<train::Summary&>(r) = mnist::train(config, out, callbacks);
  r.test_accuracy = r.evaluation.value;
  return r;
}

// The same steps: per-step loss and gradient norm within `tolerance`, the same effective batches.
inline void expect_same_steps(const Recorded& got, const Recorded& expected, double tolerance) {
  ASSERT_EQ(got.step_losses.size(), expected.step_losses.size());
  for (size_t i = 0; i < got.step_losses.size(); ++i) {
    EXPECT_NEAR(got.step_losses[i], expected.step_losses[i], tolerance) << "step " << i + 1;
    EXPECT_NEAR(got.step_grad_norms[i], expected.step_grad_norms[i], tolerance) << "step " << i + 1;
    EXPECT_EQ(got.step_batches[i], expected.step_batches[i]) << "step " << i + 1;
  }
}

// IDX writers for the fixtures (the format of examples/mnist/idx.h).
inline void put_big_endian(std::string& out, uint32_t v) {
  out += {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

inline void write_idx_images(const std::string& path, const IdxImages& images) {
  std::string head;
  put_big_endian(head, 0x800 | 3);
  put_big_endian(head, static_cast<uint32_t>(images.count));
  put_big_endian(head, static_cast<uint32_t>(images.rows));
  put_big_endian(head, static_cast<uint32_t>(images.cols));
  AtomicFile out(path);
  out.write(head);
  out.write(images.pixels.data(), images.pixels.size());
  out.commit();
}

inline void write_idx_labels(const std::string& path, const std::vector<uint8_t>& labels) {
  std::string head;
  put_big_endian(head, 0x800 | 1);
  put_big_endian(head, static_cast<uint32_t>(labels.size()));
  AtomicFile out(path);
  out.write(head);
  out.write(labels.data(), labels.size());
  out.commit();
}

inline fs::path temp_dir(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("accrue-test-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A learnable stand-in for MNIST: digit d lights a 4x4 block at a d-dependent place, plus noise.
inline void write_fixture(const fs::path& dir, const std::string& prefix, int64_t n,
                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> noise(0, 60);
  IdxImages images{n, 28, 28, std::vector<uint8_t>(static_cast<size_t>(n * 784))};
  std::vector<uint8_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int d = static_cast<int>(rng() % 10);
    labels[i] = static_cast<uint8_t>(d);
    uint8_t* img = images.pixels.data() + i * 784;
    for (int p = 0; p < 784; ++p) img[p] = static_cast<uint8_t>(noise(rng));
    const int r0 = 2 + (d / 5) * 12, c0 = 2 + (d % 5) * 5;
    for (int r = r0; r < r0 + 4; ++r)
      for (int c = c0; c < c0 + 4; ++c) img[r * 28 + c] = 255;
  }
  write_idx_images((dir / (prefix + "-images-idx3-ubyte")).string(), images);
  write_idx_labels((dir / (prefix + "-labels-idx1-ubyte")).string(), labels);
}

inline fs::path make_dataset(const std::string& name, int64_t train = 1024, int64_t test = 256) {
  const fs::path dir = temp_dir(name);
  write_fixture(dir, "train", train, 1);
  write_fixture(dir, "t10k", test, 2);
  return dir;
}

// A file's bytes as a string ("" when it cannot be read).
inline std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Each of `words` is in `text`, or the test fails naming it.
inline void expect_words(const std::string& text, const std::vector<std::string>& words) {
  for (const std::string& w : words) {
    EXPECT_NE(text.find(w), std::string::npos) << "'" << w << "' not in: " << text;
  }
}

// Runs the command line; returns {status, out, err}.
struct CliResult {
  int status;
  std::string out, err;
};
inline CliResult cli(std::vector<std::string> args) {
  args.insert(args.begin(), "accrue-mnist");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int status = mnist::run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  return {status, out.str(), err.str()};
}

}  // namespace accrue::testing
