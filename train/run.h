// A training program's exit statuses, in one place:
//   0   the run finished (or --help)
//   1   bad data, a failed write, a failure, ranks that disagree, or a run whose every step was
//       skipped
//   2   a bad command line, found before any data is read (flags.h)
//   75  stopped by SIGTERM, SIGINT or SIGUSR1 after the window in progress, with a checkpoint
//       (given --checkpoint) and the metrics written: --resume continues (signals.h)
// With several ranks a failure on one ends them all at once (the communicator aborts the job)
// instead of leaving the others waiting in the next collective; the message names the rank. A
// stop ends every rank with 75 after the same step, without an abort. While train() runs,
// SIGXFSZ is ignored: a write beyond `ulimit -f` fails with EFBIG like a full disk, names the
// file and keeps the previous one (signals.h). Read next: examples/mnist/main.cpp.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>

#include "core/error.h"

namespace accrue::train {

// A message as the programs print it: one line (control characters written as \n, \t, \xNN)
// of at most about 500 characters; a longer one keeps its start and its end, which name the file
// and what to do, around a note of how much was cut. Files may hold names a megabyte long.
std::string printable_line(const std::string& message);

// Runs body; returns 0, or prints "program: [rank R: ]message" (plus hint(e) for a FileError
// when it says something) to err and returns 1, aborting the job when several ranks run; or,
// for a Stopped run, prints its message (rank 0) and returns kExitStopped.
int run_reporting_failure(const std::string& program, std::ostream& err,
                          const std::function<void()>& body,
                          const std::function<std::string(const FileError&)>& hint = {});

}  // namespace accrue::train
