// The process-wide counters of host_waits.h: relaxed atomics, since readers only compare counts
// taken on the thread that drives the device.
#include "core/host_waits.h"

#include <atomic>

#include "core/error.h"

namespace accrue {

namespace {

std::atomic<int64_t> counters[5];

}  // namespace

std::string HostWaits::str() const {
  return str_cat("reads ", reads, ", blocking copies ", blocking_copies, ", synchronizations ",
                 synchronizations, ", polls ", polls, ", system memory calls ", system_memory);
}

HostWaits host_waits() {
  const auto get = [](HostWait k) {
    return counters[static_cast<int>(k)].load(std::memory_order_relaxed);
  };
  return {get(HostWait::kRead), get(HostWait::kBlockingCopy), get(HostWait::kSynchronization),
          get(HostWait::kPoll), get(HostWait::kSystemMemory)};
}

void count_host_wait(HostWait kind) {
  counters[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace accrue
