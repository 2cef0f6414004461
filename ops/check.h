// Validation helpers shared by the public ops: every failure names the op and the values.
#pragma once

#include "core/error.h"
#include "core/geometry.h"
#include "core/tensor.h"

namespace accrue::check {

inline void defined(const char* op, const char* what, const Tensor& t) {
  if (!t.defined()) throw ValueError(str_cat("[", op, "] ", what, " is an undefined tensor"));
}

inline void floating(const char* op, const char* what, const Tensor& t) {
  defined(op, what, t);
  if (!is_floating(t.dtype())) {
    throw DTypeError(
        str_cat("[", op, "] ", what, " must be a floating tensor, got ", t.describe()));
  }
}

inline void rank(const char* op, const char* what, const Tensor& t, int64_t r) {
  if (t.dim() != r) {
    throw ShapeError(
        str_cat("[", op, "] ", what, " must be ", r, "-D, got shape ", shape_str(t.shape())));
  }
}

inline void same_device(const char* op, const Tensor& a, const Tensor& b) {
  if (a.device() != b.device()) {
    throw DeviceError(str_cat("[", op, "] inputs are on different devices: ", a.describe(), " and ",
                              b.describe()));
  }
}

inline void same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    throw DTypeError(
        str_cat("[", op, "] inputs have different dtypes: ", a.describe(), " and ", b.describe()));
  }
}

// Both floating, same dtype and device.
inline void compatible(const char* op, const Tensor& a, const Tensor& b) {
  floating(op, "first input", a);
  floating(op, "second input", b);
  same_device(op, a, b);
  same_dtype(op, a, b);
}

// The output shape of pooling x [N, C, H, W] (ops/conv.cpp); throws, naming op, unless x is a
// floating 4-D tensor the geometry fits.
Shape pool2d_shape(const char* op, const Tensor& x, const Pool2dGeometry& g);

}  // namespace accrue::check
