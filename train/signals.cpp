// The run's signal dispositions (see signals.h). The stop handler only stores the signal number
// into a lock-free atomic: that is all a handler may safely do.
#include "train/signals.h"

#include <atomic>

#include "core/error.h"

namespace accrue::train {

namespace {

std::atomic<int> requested{0};
// The three stop signals, then the two ignored ones (the order of RunSignals::previous_).
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1, SIGXFSZ, SIGPIPE};
constexpr int kStops = 3;

extern "C" void record_stop(int signal) {
  requested.store(signal);
}

}  // namespace

RunSignals::RunSignals() {
  static_assert(std::atomic<int>::is_always_lock_free, "a signal handler needs a lock-free flag");
  requested.store(0);
  for (int i = 0; i < 5; ++i) {
    struct sigaction action {};
    sigemptyset(&action.sa_mask);
    if (i < kStops) {
      action.sa_handler = record_stop;
      // SA_RESETHAND: the next signal of the kind takes the default action (ends the process).
      action.sa_flags = SA_RESTART | SA_RESETHAND;
    } else {
      action.sa_handler = SIG_IGN;
    }
    if (sigaction(kSignals[i], &action, &previous_[i]) != 0) {
      throw std::runtime_error(str_cat("cannot set the action of ", signal_name(kSignals[i])));
    }
  }
}

RunSignals::~RunSignals() {
  for (int i = 0; i < 5; ++i) sigaction(kSignals[i], &previous_[i], nullptr);
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
