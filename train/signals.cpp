// Stop requests by signal (see signals.h). The handler only stores the signal number into a
// lock-free atomic: that is all a handler may safely do.
#include "train/signals.h"

#include <signal.h>

#include <atomic>

#include "core/error.h"

namespace accrue::train {

namespace {

std::atomic<int> requested{0};
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
struct sigaction previous[3];

extern "C" void record_stop(int signal) {
  requested.store(signal);
}

}  // namespace

StopSignals::StopSignals() {
  static_assert(std::atomic<int>::is_always_lock_free, "a signal handler needs a lock-free flag");
  requested.store(0);
  for (int i = 0; i < 3; ++i) {
    struct sigaction action {};
    action.sa_handler = record_stop;
    sigemptyset(&action.sa_mask);
    // SA_RESETHAND: the next signal of the kind takes the default action (ends the process).
    action.sa_flags = SA_RESTART | SA_RESETHAND;
    if (sigaction(kSignals[i], &action, &previous[i]) != 0) {
      throw std::runtime_error("cannot install the stop signal handlers");
    }
  }
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &previous[i], nullptr);
}

int stop_requested() {
  return requested.load();
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return str_cat("signal ", signal);
  }
}

}  // namespace accrue::train
