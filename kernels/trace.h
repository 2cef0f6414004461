// ACCRUE_TRACE=1: a decorator over the backend interface that prints every primitive as it runs,
// with its tensors' dtypes, shapes and devices and its scalar arguments, then forwards the call.
// backend_for() hands it out instead of the device's backend when the environment variable is
// set, so docs/data-path.md can be checked against what the program really does:
//   ACCRUE_TRACE=1 build/examples/accrue-mnist --max-steps 1 ... 2> trace.txt
#pragma once

#include <iosfwd>
#include <memory>

#include "kernels/backend.h"

namespace accrue {

// Whether ACCRUE_TRACE is set to something other than "" or "0" (read once).
bool trace_enabled();

// Wraps `inner`; each call prints one line to `out` before forwarding.
std::unique_ptr<Backend> make_tracing_backend(Backend& inner, std::ostream& out);

}  // namespace accrue
