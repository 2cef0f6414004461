// Turns a runtime dtype into a compile-time element type for a kernel body, in one spelling for
// both backends: ACCRUE_DISPATCH_FLOATING(dtype, "relu", [&] { ... T ... }). The body is a plain
// lambda (nvcc takes no device lambdas inside generic lambdas), and on the CPU it holds no OpenMP
// pragma (a macro argument cannot): the loops live in kernels/cpu/parallel.h. The _AS forms name
// the alias (casts dispatch twice, as S and D). The _AND_HALF forms add bfloat16 and float16
// for the kernels that handle them (loading into compute_t<T>, core/half.h); the others keep
// the plain forms, which name the dtypes they take in their error. The _ALL forms add int32 and
// int64 too, for the kernels that only move or convert values (fill, cast).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/functors.h"

namespace accrue {

[[noreturn]] inline void dispatch_error(const char* op, DType dtype, const char* expected) {
  throw DTypeError(str_cat("[", op, "] expects ", expected, ", got ", dtype_name(dtype)));
}

// The output an accumulating kernel over T inputs may write: T, or float32 when T is a 16-bit
// type (gradients of 16-bit activations summed into the float32 arena). Throws otherwise.
template <typename T>
bool accumulates_in_float(const char* op, DType out) {
  if (out == dtype_of<T>()) return false;
  if (is_half_v<T> && out == DType::kFloat32) return true;
  throw DTypeError(str_cat("[", op, "] cannot write a ", dtype_name(dtype_of<T>()),
                           " result into a ", dtype_name(out), " tensor"));
}

// f(pointer to out's elements), typed T or float as accumulates_in_float says (host loops).
template <typename T, typename F>
void with_wide_output(Tensor& out, const char* op, F f) {
  if constexpr (is_half_v<T>) {
    if (accumulates_in_float<T>(op, out.dtype())) return f(out.data<float>());
  } else {
    accumulates_in_float<T>(op, out.dtype());
  }
  f(out.data<T>());
}

// The elements of an optional tensor (an absent affine weight, bias or gradient): null when
// undefined.
template <typename T>
const T* optional_data(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <typename T>
T* optional_data(Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// f(pointer to the working copy's elements): bf16*, f16*, or a null fn::NoWorkingCopy* when
// working is undefined (Backend::adam_step, sgd_step).
template <typename F>
void with_working_copy(Tensor& working, const char* op, F f) {
  if (!working.defined()) return f(static_cast<fn::NoWorkingCopy*>(nullptr));
  if (working.dtype() == DType::kBFloat16) return f(working.data<bf16>());
  if (working.dtype() == DType::kFloat16) return f(working.data<f16>());
  dispatch_error(op, working.dtype(), "a bfloat16 or float16 working copy");
}

// Backend::permute's index arithmetic for x's shape and dims (checked by the public op: a
// permutation of at most fn::PermuteIndex::kMaxDims dimensions).
inline fn::PermuteIndex permute_index(const Shape& in, const Shape& dims) {
  fn::PermuteIndex p;
  p.rank = static_cast<int>(dims.size());
  int64_t stride = 1;
  std::vector<int64_t> in_stride(in.size());
  for (size_t d = in.size(); d-- > 0;) {
    in_stride[d] = stride;
    stride *= in[d];
  }
  for (int i = 0; i < p.rank; ++i) {
    p.size[i] = in[static_cast<size_t>(dims[static_cast<size_t>(i)])];
    p.in_stride[i] = in_stride[static_cast<size_t>(dims[static_cast<size_t>(i)])];
  }
  return p;
}

}  // namespace accrue

#define ACCRUE_DISPATCH_FLOATING_AS(T, dtype, op, ...) \
  ACCRUE_DISPATCH_FLOAT_CASES_(T, dtype, op, "float32 or float64", __VA_ARGS__)

#define ACCRUE_DISPATCH_FLOAT_CASES_(T, dtype, op, expected, ...) \
  [&] {                                                           \
    switch (dtype) {                                              \
      case ::accrue::DType::kFloat32: {                           \
        using T = float;                                          \
        return __VA_ARGS__();                                     \
      }                                                           \
      case ::accrue::DType::kFloat64: {                           \
        using T = double;                                         \
        return __VA_ARGS__();                                     \
      }                                                           \
      default:                                                    \
        ::accrue::dispatch_error(op, dtype, expected);            \
    }                                                             \
  }()

#define ACCRUE_DISPATCH_FLOATING_AND_HALF_AS(T, dtype, op, ...)                         \
  [&] {                                                                                 \
    if ((dtype) == ::accrue::DType::kBFloat16) {                                        \
      using T = ::accrue::bf16;                                                         \
      return __VA_ARGS__();                                                             \
    }                                                                                   \
    if ((dtype) == ::accrue::DType::kFloat16) {                                         \
      using T = ::accrue::f16;                                                          \
      return __VA_ARGS__();                                                             \
    }                                                                                   \
    return ACCRUE_DISPATCH_FLOAT_CASES_(T, dtype, op, "a floating dtype", __VA_ARGS__); \
  }()

#define ACCRUE_DISPATCH_ALL_AS(T, dtype, op, ...)                           \
  [&] {                                                                     \
    if ((dtype) == ::accrue::DType::kInt32) {                               \
      using T = int32_t;                                                    \
      return __VA_ARGS__();                                                 \
    }                                                                       \
    if ((dtype) == ::accrue::DType::kInt64) {                               \
      using T = int64_t;                                                    \
      return __VA_ARGS__();                                                 \
    }                                                                       \
    return ACCRUE_DISPATCH_FLOATING_AND_HALF_AS(T, dtype, op, __VA_ARGS__); \
  }()

#define ACCRUE_DISPATCH_FLOATING(dtype, op, ...) \
  ACCRUE_DISPATCH_FLOATING_AS(T, dtype, op, __VA_ARGS__)
#define ACCRUE_DISPATCH_FLOATING_AND_HALF(dtype, op, ...) \
  ACCRUE_DISPATCH_FLOATING_AND_HALF_AS(T, dtype, op, __VA_ARGS__)
#define ACCRUE_DISPATCH_ALL(dtype, op, ...) ACCRUE_DISPATCH_ALL_AS(T, dtype, op, __VA_ARGS__)
