// Factories and conversions that run a kernel (see factories.h): each is one backend primitive
// (fill or cast) on the tensor's device.
#include "kernels/factories.h"

#include "kernels/backend.h"

namespace accrue {

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill_(t, value);
  return t;
}

Tensor scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

void fill_(const Tensor& t, double value) {
  Tensor out = t;
  backend_for(t.device()).fill(out, value);
  t.mark_modified();
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  backend_for(t.device()).cast(t, out);
  return out;
}

namespace {

// A tensor of draws from a host distribution, converted to dtype and moved to device.
template <typename Distribution>
Tensor draw(const Shape& shape, Distribution dist, std::mt19937_64& rng, DType dtype,
            Device device) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (double& v : values) v = dist(rng);
  return to_dtype(Tensor::from_vector(shape, values), dtype).to(device);
}

}  // namespace

Tensor uniform(const Shape& shape, double low, double high, std::mt19937_64& rng, DType dtype,
               Device device) {
  return draw(shape, std::uniform_real_distribution<double>(low, high), rng, dtype, device);
}

Tensor normal(const Shape& shape, double mean, double std, std::mt19937_64& rng, DType dtype,
              Device device) {
  return draw(shape, std::normal_distribution<double>(mean, std), rng, dtype, device);
}

}  // namespace accrue
