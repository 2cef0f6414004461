// The exceptions accrue throws and helpers that build their messages. Every message starts with
// the op in brackets and carries the actual values: "[linear] input has shape [32, 700] but
// weight expects in_features = 784". Library code never exits or aborts.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace accrue {

// Bad shapes, dtypes, devices or argument values given to an op.
struct ShapeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct DTypeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct DeviceError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct ValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// Misuse of the tape: backward twice, non-scalar backward without a seed, ...
struct AutogradError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A failure reported by a backend library (CUDA, cuBLAS, ...), with its own error string.
struct BackendError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The device has no memory left for a request, even after the allocator's pool was released.
struct OutOfMemoryError : BackendError {
  using BackendError::BackendError;
};
// A CUDA graph could not be captured (core/graph.h): the reason, from the call that refused.
struct GraphCaptureError : BackendError {
  using BackendError::BackendError;
};
// An op that cannot be captured in a CUDA graph (its kernel takes a value the host changes from
// call to call), refusing during a capture before it has changed anything.
struct NotCapturable : ValueError {
  using ValueError::ValueError;
};
// A data or checkpoint file that is missing, truncated or corrupt.
struct FileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "[2, 3]"
std::string shape_str(const std::vector<int64_t>& shape);

// Concatenates anything streamable: str_cat("[add] a has ", 3, " elements").
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace accrue
