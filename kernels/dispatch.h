// Turns a runtime dtype into a compile-time element type for a kernel body:
//   dispatch_floating(t.dtype(), "relu", [&](auto tag) { using T = decltype(tag); ... });
// Shared by the CPU and CUDA backends.
#pragma once

#include "core/dtype.h"
#include "core/error.h"

namespace accrue {

template <typename F>
void dispatch_floating(DType dtype, const char* op, F&& body) {
  switch (dtype) {
    case DType::kFloat32: body(float{}); return;
    case DType::kFloat64: body(double{}); return;
    default:
      throw DTypeError(str_cat("[", op, "] expects float32 or float64, got ", dtype_name(dtype)));
  }
}

template <typename F>
void dispatch_all(DType dtype, const char* op, F&& body) {
  if (dtype == DType::kInt32) {
    body(int32_t{});
    return;
  }
  dispatch_floating(dtype, op, body);
}

}  // namespace accrue
