// End to end on the CPU: a small synthetic classification problem (Gaussian clusters) trained
// by an MLP with Adam to high accuracy, through the same modules, arena and fused step the
// MNIST trainer uses.
#include "test_util.h"

namespace accrue::testing {
namespace {

struct Blobs {
  Tensor x, y;
};

// n samples around `classes` centers that depend only on dim and classes; seed draws the noise.
Blobs make_blobs(int64_t n, int64_t dim, int32_t classes, uint64_t seed) {
  std::mt19937_64 center_rng(12345), rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> centers(static_cast<size_t>(classes * dim));
  for (float& c : centers) c = 2.0f * noise(center_rng);
  std::vector<float> x(static_cast<size_t>(n * dim));
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<int32_t>(i % classes);
    for (int64_t d = 0; d < dim; ++d) x[i * dim + d] = centers[y[i] * dim + d] + noise(rng);
  }
  return {Tensor::from_vector<float>({n, dim}, x), Tensor::from_vector<int32_t>({n}, y)};
}

TEST(Train, MlpLearnsGaussianClusters) {
  nn::manual_seed(7);
  const Blobs train = make_blobs(512, 16, 4, 1), test = make_blobs(256, 16, 4, 2);
  nn::Sequential model;
  model.add(std::make_shared<nn::Linear>(16, 32));
  model.add(std::make_shared<nn::GELU>());
  model.add(std::make_shared<nn::Linear>(32, 4));
  optim::ParameterArena arena(model);
  optim::Adam adam(arena, {});
  nn::CrossEntropyLoss loss_fn;
  const int64_t batch = 64;
  for (int epoch = 0; epoch < 20; ++epoch) {
    for (int64_t start = 0; start < 512; start += batch) {
      backward(loss_fn(model(train.x.narrow(start, batch)), train.y.narrow(start, batch)),
               1.0 / batch);
      adam.step(1.0);
    }
  }
  NoGradGuard eval;
  const double accuracy = double(count_equal(argmax(model(test.x)), test.y)) / 256;
  EXPECT_GE(accuracy, 0.97);
}

}  // namespace
}  // namespace accrue::testing
