// Sequential forward.
#include "nn/sequential.h"

namespace accrue::nn {

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& layer : layers_) h = (*layer)(h);
  return h;
}

}  // namespace accrue::nn
