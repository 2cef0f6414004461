// The clock accrue times its work with (windows, stages, epochs), and the seconds since a point
// of it. Read next: threads.h.
#pragma once

#include <chrono>

namespace accrue {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace accrue
