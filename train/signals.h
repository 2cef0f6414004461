// Stopping a run cleanly on request. Clusters preempt jobs with SIGTERM (SLURM's --signal,
// Kubernetes), users press Ctrl-C (SIGINT), schedulers send SIGUSR1 ahead of a time limit. While
// a StopSignals guard lives, each of the three only records that a stop was requested; the
// engine finishes the window in progress, writes a checkpoint and its metrics, and ends with
// kExitStopped (the stop request travels with the boundary's all-reduce, so every rank stops
// after the same step). A second signal of the same kind gets the default action: a run that
// does not stop can still be killed with a second Ctrl-C. Read next: engine.cpp (Run::train).
#pragma once

#include <stdexcept>
#include <string>

namespace accrue::train {

// The exit status of a run stopped by a signal after saving what it had (EX_TEMPFAIL: "try
// again": --resume continues it).
constexpr int kExitStopped = 75;

class StopSignals {
 public:
  StopSignals();   // installs the handlers for SIGTERM, SIGINT and SIGUSR1
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
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
