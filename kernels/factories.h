// Tensor factories and conversions that run a kernel, above the base Tensor (which only moves
// bytes): a tensor filled with a value, a fill in place, a dtype conversion, and random draws.
// None of them is recorded on the autograd tape; the recorded conversion is cast() in
// ops/ops.h. Read next: kernels/backend.h.
#pragma once

#include <random>

#include "core/tensor.h"

namespace accrue {

// A tensor of `value` in every element (value converted to dtype as a static_cast would).
Tensor full(const Shape& shape, double value, DType dtype = DType::kFloat32,
            Device device = Device::cpu());
// A 0-d tensor holding value.
Tensor scalar(double value, DType dtype = DType::kFloat32, Device device = Device::cpu());
// Sets every element of t to value, in place (bumps its version).
void fill_(const Tensor& t, double value);
// t converted to dtype on its own device (t itself when the dtype already matches): floats
// round to nearest even, integers truncate toward zero.
Tensor to_dtype(const Tensor& t, DType dtype);
// Uniform in [low, high) / normal(mean, std), drawn in float64 on the host from `rng`, then
// converted to dtype and moved to device.
Tensor uniform(const Shape& shape, double low, double high, std::mt19937_64& rng,
               DType dtype = DType::kFloat32, Device device = Device::cpu());
Tensor normal(const Shape& shape, double mean, double std, std::mt19937_64& rng,
              DType dtype = DType::kFloat32, Device device = Device::cpu());

}  // namespace accrue
