// accrue-norm-caveat: the BatchNorm caveat as numbers. For each normalisation of the MNIST CNN
// (float64), the relative L2 difference between the window gradient accumulated as 32 x 4 and
// the one computed as 128 x 1, on the same weights, at steps 0, 10 and 20 of a run that trains
// on the 128 x 1 gradients (random inputs and labels; the point is the split, not the data).
// Prints a Markdown table. Usage: accrue-norm-caveat
#include <cmath>
#include <cstdio>
#include <vector>

#include "accrue.h"
#include "cnn.h"

namespace {

using namespace accrue;

double rel_l2(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    diff += (va[i] - vb[i]) * (va[i] - vb[i]);
    norm += vb[i] * vb[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace

int main() {
  const int64_t windows = 21, batch = 128;
  std::mt19937_64 rng(5);
  const Tensor x = uniform({windows * batch, 784}, 0, 1, rng, DType::kFloat64);
  std::vector<int32_t> labels(static_cast<size_t>(windows * batch));
  for (auto& l : labels) l = static_cast<int32_t>(rng() % 10);
  const Tensor y = Tensor::from_vector<int32_t>({windows * batch}, labels);
  std::printf("| norm | step 0 | step 10 | step 20 |\n|---|---|---|---|\n");
  for (const char* name : {"none", "batch", "group", "group1"}) {
    nn::manual_seed(1);
    mnist::MnistCNN model(mnist::MnistCNN::parse_norm(name), DType::kFloat64);
    optim::ParameterArena arena(model);
    optim::Adam adam(arena);
    optim::Accumulator acc(adam, {1.0, 1e-3, {}});
    const auto accumulate = [&](int64_t start, int64_t micro) {
      acc.begin_window(batch);
      for (int64_t at = start; at < start + batch; at += micro) {
        acc.micro_step(
            micro, [&] { return cross_entropy(model(x.narrow(at, micro)), y.narrow(at, micro)); });
      }
      return arena.grads().clone();
    };
    std::printf("| %s |", name);
    for (int64_t w = 0; w < windows; ++w) {
      if (w % 10 == 0) {
        const Tensor split = accumulate(w * batch, 32);
        acc.abandon_window();
        const Tensor whole = accumulate(w * batch, batch);
        std::printf(" %.2e |", rel_l2(split, whole));
        acc.step();
      } else {
        accumulate(w * batch, batch);
        acc.step();
      }
    }
    std::printf("\n");
  }
  return 0;
}
