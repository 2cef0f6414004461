// Element types a tensor can hold. float32 is the training type; float64 exists so gradients can
// be checked against finite differences; int32 holds class labels and argmax results. Half types
// (bf16/f16) slot in here later. Read next: device.h, tensor.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace accrue {

enum class DType { kFloat32, kFloat64, kInt32 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
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
  }
  return "?";
}

inline bool is_floating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64;
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

}  // namespace accrue
