// Turns a runtime dtype into a compile-time element type for a kernel body, in two spellings:
//  - CPU: dispatch_floating(dtype, "relu", [&](auto tag) { using T = decltype(tag); ... });
//    a generic lambda, so the body can hold OpenMP pragmas (which macro arguments cannot);
//  - CUDA: ACCRUE_DISPATCH_FLOATING(dtype, "relu", [&] { ... T ... }); a plain lambda, because
//    nvcc forbids device lambdas inside generic lambdas. The _AS forms name the alias.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace accrue {

[[noreturn]] inline void dispatch_error(const char* op, DType dtype, const char* expected) {
  throw DTypeError(str_cat("[", op, "] expects ", expected, ", got ", dtype_name(dtype)));
}

}  // namespace accrue

#define ACCRUE_DISPATCH_FLOATING_AS(T, dtype, op, ...)             \
  [&] {                                                            \
    switch (dtype) {                                               \
      case ::accrue::DType::kFloat32: {                            \
        using T = float;                                           \
        return __VA_ARGS__();                                      \
      }                                                            \
      case ::accrue::DType::kFloat64: {                            \
        using T = double;                                          \
        return __VA_ARGS__();                                      \
      }                                                            \
      default:                                                     \
        ::accrue::dispatch_error(op, dtype, "float32 or float64"); \
    }                                                              \
  }()

#define ACCRUE_DISPATCH_ALL_AS(T, dtype, op, ...)                  \
  [&] {                                                            \
    if ((dtype) == ::accrue::DType::kInt32) {                      \
      using T = int32_t;                                           \
      return __VA_ARGS__();                                        \
    }                                                              \
    return ACCRUE_DISPATCH_FLOATING_AS(T, dtype, op, __VA_ARGS__); \
  }()

#define ACCRUE_DISPATCH_FLOATING(dtype, op, ...) \
  ACCRUE_DISPATCH_FLOATING_AS(T, dtype, op, __VA_ARGS__)
#define ACCRUE_DISPATCH_ALL(dtype, op, ...) ACCRUE_DISPATCH_ALL_AS(T, dtype, op, __VA_ARGS__)

namespace accrue {

// The CPU spelling, on top of the macros: body receives a value of the element type.
template <typename F>
void dispatch_floating(DType dtype, const char* op, F&& body) {
  ACCRUE_DISPATCH_FLOATING(dtype, op, [&] { body(T{}); });
}

template <typename F>
void dispatch_all(DType dtype, const char* op, F&& body) {
  ACCRUE_DISPATCH_ALL(dtype, op, [&] { body(T{}); });
}

}  // namespace accrue
