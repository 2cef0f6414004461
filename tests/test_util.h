// Helpers shared by the tests: the devices present, finite-difference gradient checks in
// float64, and tensor comparisons with readable failure messages.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "accrue.h"
#include "kernels/backend.h"
#include "optim/safetensors.h"

namespace accrue {
inline void PrintTo(const Device& d, std::ostream* out) {
  *out << d.str();
}
}  // namespace accrue

namespace accrue::testing {

// cpu, plus cuda:0 when a GPU can be used.
inline std::vector<Device> devices() {
  std::vector<Device> out{Device::cpu()};
  if (cuda_device_count() > 0) out.push_back(Device::cuda(0));
  return out;
}

// Skips the current test (with the reason) when no GPU is usable.
#define ACCRUE_REQUIRE_CUDA()                                                    \
  do {                                                                           \
    if (::accrue::cuda_device_count() == 0) {                                    \
      GTEST_SKIP() << "no CUDA device: " << ::accrue::cuda_unavailable_reason(); \
    }                                                                            \
  } while (0)

// Skips the current test (with the reason) when `device` cannot run convolutions: a GPU of a
// build without cuDNN. For the convolution rows of the device tables.
#define ACCRUE_SKIP_UNLESS_CONVOLVES(device)                                             \
  do {                                                                                   \
    const std::string accrue_reason_ = ::accrue::conv_unavailable_reason(device);        \
    if (!accrue_reason_.empty()) {                                                       \
      GTEST_SKIP() << "no convolutions on " << (device).str() << ": " << accrue_reason_; \
    }                                                                                    \
  } while (0)

inline std::vector<double> as_doubles(const Tensor& t) {
  return to_dtype(t.to(Device::cpu()), DType::kFloat64).to_vector<double>();
}

// max |a - b| / max(1, |b|) over all elements.
inline double max_rel_error(const Tensor& a, const Tensor& b) {
  const auto va = as_doubles(a), vb = as_doubles(b);
  EXPECT_EQ(va.size(), vb.size());
  double worst = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
    worst = std::max(worst, std::abs(va[i] - vb[i]) / std::max(1.0, std::abs(vb[i])));
  }
  return worst;
}

// Two safetensors files hold the same tensor names, each pair within `tolerance` (max_rel_error).
inline void expect_same_weights(const std::string& path, const std::string& expected_path,
                                double tolerance) {
  const auto got = optim::read_safetensors(path);
  const auto expected = optim::read_safetensors(expected_path);
  ASSERT_EQ(got.size(), expected.size()) << path << " and " << expected_path;
  for (const auto& [name, t] : expected) {
    const auto it = got.find(name);
    ASSERT_NE(it, got.end()) << name << " is missing from " << path;
    EXPECT_LT(max_rel_error(it->second, t), tolerance) << name;
  }
}

// ||a - b|| / ||b|| over all elements (a norm-wise relative error).
inline double rel_l2(const Tensor& a, const Tensor& b) {
  const auto va = as_doubles(a), vb = as_doubles(b);
  EXPECT_EQ(va.size(), vb.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
    diff += (va[i] - vb[i]) * (va[i] - vb[i]);
    norm += vb[i] * vb[i];
  }
  return std::sqrt(diff / norm);
}

inline Tensor random(const Shape& shape, uint64_t seed, DType dtype = DType::kFloat64,
                     double low = -1.0, double high = 1.0) {
  std::mt19937_64 rng(seed);
  return uniform(shape, low, high, rng, dtype);
}

// Checks the gradients backward() gives for every input of f against central differences.
// f maps float64 leaves to a 0-d tensor. Returns the worst relative error. With max_probes > 0
// only that many elements of each input are probed, spread evenly and including the first and
// the last (large inputs: the analytic gradient still covers every element).
inline double gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                        std::vector<Tensor> inputs, double eps = 1e-6, int64_t max_probes = 0) {
  for (auto& t : inputs) t.set_requires_grad(true);
  backward(f(inputs));
  double worst = 0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor analytic = inputs[k].grad();
    EXPECT_TRUE(analytic.defined()) << "input " << k << " got no gradient";
    if (!analytic.defined()) continue;
    const auto a = analytic.to_vector<double>();
    double* x = inputs[k].data<double>();
    const int64_t n = inputs[k].numel();
    const int64_t probes = max_probes > 0 ? std::min(max_probes, n) : n;
    for (int64_t p = 0; p < probes; ++p) {
      const int64_t i = probes > 1 ? p * (n - 1) / (probes - 1) : 0;
      NoGradGuard no_grad;
      const double saved = x[i];
      x[i] = saved + eps;
      const double up = f(inputs).item();
      x[i] = saved - eps;
      const double down = f(inputs).item();
      x[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double err =
          std::abs(numeric - a[static_cast<size_t>(i)]) / std::max(1.0, std::abs(numeric));
      worst = std::max(worst, err);
    }
  }
  return worst;
}

// Expects `body` to throw E with a message containing every one of `parts`.
template <typename E, typename F>
void expect_error(F body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string message = e.what();
    for (const auto& p : parts) {
      EXPECT_NE(message.find(p), std::string::npos)
          << "message '" << message << "' lacks '" << p << "'";
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace accrue::testing
