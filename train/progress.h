// A run's progress for the person watching it. On a terminal (stderr a terminal, one process,
// the engine writing to std::cout) one line on stderr redrawn in place: epoch, step, a bar, loss,
// throughput, elapsed time and the run's ETA. Otherwise (a file, a pipe, every rank of several,
// which mpirun gives pseudo-terminals) a plain line on the run's stream every few seconds and at
// each epoch's end, without carriage returns. Every other message goes on its own line: clear()
// ends the line in place first. The caller's stream keeps its format flags.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "core/clock.h"

namespace accrue::train {

// "0:07", "12:30", "1:02:03": a duration for people.
std::string clock_time(double seconds);

class Progress {
 public:
  struct Span {
    int64_t steps_per_epoch = 0;
    int64_t first_step = 0;   // the step this process starts from (after a resume)
    int64_t total_steps = 0;  // the step the run ends at: the ETA's horizon
  };
  // `terminal`: draw in place on `terminal_out` (the caller decides: is_terminal_run below).
  Progress(std::ostream& out, std::ostream& terminal_out, bool quiet, bool terminal, Span span);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_steps_per_epoch(int64_t steps);
  // After optimizer step `step`, the `step_in_epoch`-th of epoch `epoch` (from 0).
  void update(int64_t epoch, int64_t step_in_epoch, int64_t step, double loss, double grad_norm,
              double lr, double samples_per_second);
  void end_epoch() { clear(); }
  // Ends the line drawn in place (if any), so that what is written next starts a line.
  void clear();

  // Plain lines at most this often (and at each epoch's end).
  static constexpr double kPlainSeconds = 5;

 private:
  std::string eta(int64_t step) const;

  std::ostream &out_, &terminal_out_;
  bool quiet_, terminal_;
  Span span_;
  bool drawn_ = false;  // a line in place awaits clear()
  Clock::time_point start_ = Clock::now(), last_ = start_;
  bool printed_ = false;
};

// Whether this process draws its progress in place: stderr is a terminal, the engine writes to
// std::cout, and the run is one process.
bool is_terminal_run(const std::ostream& out, int world_size);

}  // namespace accrue::train
