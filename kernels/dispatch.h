// Turns a runtime dtype into a compile-time element type for a kernel body, in one spelling for
// both backends: ACCRUE_DISPATCH_FLOATING(dtype, "relu", [&] { ... T ... }). The body is a plain
// lambda (nvcc takes no device lambdas inside generic lambdas), and on the CPU it holds no OpenMP
// pragma (a macro argument cannot): the loops live in kernels/cpu/parallel.h. The _AS forms name
// the alias (casts dispatch twice, as S and D).
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
