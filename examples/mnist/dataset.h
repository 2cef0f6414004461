// An MNIST split in memory: images normalised as (x / 255 - 0.1307) / 0.3081 into float32
// [N, 784] and labels int32 [N], on the training device (on CUDA the whole dataset lives on
// the GPU).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace accrue::mnist {

struct Split {
  Tensor images;           // float32 [N, rows * cols]
  Tensor labels;           // int32 [N]
  std::string image_path;  // for messages
  int64_t size() const { return labels.numel(); }
};

// Reads DIR/{prefix}-images-idx3-ubyte and DIR/{prefix}-labels-idx1-ubyte (prefix "train" or
// "t10k"), checking that the counts agree, that there is at least one sample and that labels
// are digits; keeps the first `limit` samples when limit > 0. Images are converted to dtype
// (float32, or float64 for exactness studies).
Split load_split(const std::string& dir, const std::string& prefix, int64_t limit, Device device,
                 DType dtype = DType::kFloat32);

}  // namespace accrue::mnist
