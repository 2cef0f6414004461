// The signals of a training run. Clusters preempt jobs with SIGTERM (SLURM's --signal,
// Kubernetes), users press Ctrl-C (SIGINT), schedulers send SIGUSR1 ahead of a time limit. While
// a RunSignals guard lives, each of the three only records that a stop was requested; the engine
// finishes the window in progress, writes a checkpoint and its metrics, and ends with
// kExitStopped (the stop request travels with the boundary's all-reduce, so every rank stops
// after the same step). A second signal of the same kind gets the default action: a run that
// does not stop can still be killed with a second Ctrl-C. SIGXFSZ and SIGPIPE are ignored, so a
// file beyond `ulimit -f` (EFBIG) or a metrics pipe whose reader left (EPIPE) is a failed write
// that names its file, not a silent death. Read next: engine.cpp (Run::train).
#pragma once

#include <signal.h>

#include <stdexcept>
#include <string>

namespace accrue::train {

// The exit status of a run stopped by a signal after saving what it had (EX_TEMPFAIL: "try
// again": --resume continues it).
constexpr int kExitStopped = 75;

class RunSignals {
 public:
  RunSignals();   // installs the stop handlers and ignores SIGXFSZ and SIGPIPE
  ~RunSignals();  // restores what was there before
  RunSignals(const RunSignals&) = delete;
  RunSignals& operator=(const RunSignals&) = delete;

 private:
  struct sigaction previous_[5];
};

// The signal that requested a stop since the guard was made (0: none).
int stop_requested();
// "SIGTERM", "SIGINT", "SIGUSR1", or "signal N".
std::string signal_name(int signal);

// Thrown by train() after a requested stop was carried out; run_reporting_failure (run.h) prints
// its message and returns kExitStopped on every rank, without aborting the job.
class Stopped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace accrue::train
