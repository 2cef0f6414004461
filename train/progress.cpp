// Progress lines (see progress.h). Each line is built in a string stream of its own, so the
// caller's stream keeps its flags and precision.
#include "train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace accrue::train {

std::string clock_time(double seconds) {
  const int64_t s = std::isfinite(seconds) ? std::llround(std::max(seconds, 0.0)) : 0;
  std::ostringstream t;
  t << std::setfill('0');
  if (s >= 3600)
    t << s / 3600 << ":" << std::setw(2) << s / 60 % 60;
  else
    t << s / 60;
  t << ":" << std::setw(2) << s % 60;
  return t.str();
}

bool is_terminal_run(const std::ostream& out, int world_size) {
  return world_size == 1 && &out == &std::cout && isatty(STDERR_FILENO) == 1;
}

Progress::Progress(std::ostream& out, std::ostream& terminal_out, bool quiet, bool terminal,
                   Span span)
    : out_(out), terminal_out_(terminal_out), quiet_(quiet), terminal_(terminal), span_(span) {}

Progress::~Progress() {
  clear();
}

void Progress::set_steps_per_epoch(int64_t steps) {
  span_.steps_per_epoch = steps;
}

// The time left at the pace of this process's steps so far.
std::string Progress::eta(int64_t step) const {
  const int64_t done = step - span_.first_step, left = span_.total_steps - step;
  if (done <= 0 || left < 0) return "?";
  return clock_time(seconds_since(start_) / static_cast<double>(done) * static_cast<double>(left));
}

void Progress::update(int64_t epoch, int64_t step_in_epoch, int64_t step, double loss,
                      double grad_norm, double lr, double rate) {
  if (quiet_) return;
  const bool epoch_end = step_in_epoch == span_.steps_per_epoch;
  const double every = terminal_ ? 0.1 : kPlainSeconds;
  if (printed_ && seconds_since(last_) < every && !epoch_end) return;
  std::ostringstream line;
  line << std::fixed;
  if (terminal_) {
    const int width = 20;
    const int64_t filled = width * step_in_epoch / std::max<int64_t>(span_.steps_per_epoch, 1);
    line << "\r\033[Kepoch " << epoch + 1 << " [" << std::string(filled, '=')
         << std::string(width - filled, ' ') << "] " << step_in_epoch << "/"
         << span_.steps_per_epoch << " loss " << std::setprecision(4) << loss << " "
         << std::setprecision(0) << rate << " samples/s " << clock_time(seconds_since(start_))
         << " eta " << eta(step);
    terminal_out_ << line.str() << std::flush;
    drawn_ = true;
  } else {
    line << "epoch " << epoch + 1 << " step " << step << " (" << step_in_epoch << "/"
         << span_.steps_per_epoch << ") loss " << std::setprecision(4) << loss << " grad_norm "
         << grad_norm << " lr " << std::scientific << std::setprecision(2) << lr << std::fixed
         << " " << std::setprecision(0) << rate << " samples/s elapsed "
         << clock_time(seconds_since(start_)) << " eta " << eta(step) << "\n";
    out_ << line.str() << std::flush;
  }
  printed_ = true;
  last_ = Clock::now();
}

void Progress::clear() {
  if (!drawn_) return;
  terminal_out_ << "\r\033[K" << std::flush;
  drawn_ = false;
}

}  // namespace accrue::train
