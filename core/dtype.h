// Element types a tensor can hold. float32 is the training type; float64 exists so gradients can
// be checked against finite differences; bfloat16 and float16 hold the activations and the
// working copy of the weights of mixed-precision training (core/half.h; arithmetic on them is
// done in float); int32 holds class labels and argmax results; int64 holds counters that PyTorch
// keeps in int64 (BatchNorm's num_batches_tracked), so its files load and save as they are.
// Integer tensors are filled, copied, cast and moved; arithmetic ops take only floating ones.
// Read next: device.h, tensor.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/half.h"

namespace accrue {

enum class DType { kFloat32, kFloat64, kInt32, kBFloat16, kFloat16, kInt64 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

// The 16-bit floating types.
inline bool is_half(DType t) {
  return t == DType::kBFloat16 || t == DType::kFloat16;
}

// The dtype kernels compute a floating dtype's elements in (compute_t in half.h): float32 for the
// 16-bit types, the dtype itself otherwise.
inline DType compute_dtype(DType t) {
  return is_half(t) ? DType::kFloat32 : t;
}

inline bool is_floating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || is_half(t);
}

inline bool is_integer(DType t) {
  return t == DType::kInt32 || t == DType::kInt64;
}

// Whether every value of `from` is exactly a value of `to` among the integer dtypes (int32 into
// int64): a saved integer tensor of such a dtype loads into a buffer of the other.
inline bool integer_widens(DType from, DType to) {
  return is_integer(from) && is_integer(to) && dtype_size(from) <= dtype_size(to);
}

// Maps a C++ type to its DType tag: dtype_of<float>() == DType::kFloat32.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::kBFloat16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::kFloat16;
}

}  // namespace accrue
