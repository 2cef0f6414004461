// A training program's exit statuses, in one place: 0 after a run (or --help), 2 for a bad
// command line (before any data is read: flags.h), 1 for bad data, a failure, or a run whose
// every step was skipped. With several ranks a failure on one ends them all at once (the
// communicator aborts the job) instead of leaving the others waiting in the next collective;
// the message names the rank. Read next: examples/mnist/main.cpp.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>

#include "core/error.h"

namespace accrue::train {

// Runs body; returns 0, or prints "program: [rank R: ]message" (plus hint(e) for a FileError
// when it says something) to err and returns 1, aborting the job when several ranks run.
int run_reporting_failure(const std::string& program, std::ostream& err,
                          const std::function<void()>& body,
                          const std::function<std::string(const FileError&)>& hint = {});

}  // namespace accrue::train
