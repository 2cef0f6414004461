// Exit statuses and aborting the job (see run.h).
#include "train/run.h"

#include <ostream>

#include "distributed/communicator.h"
#include "train/signals.h"

namespace accrue::train {

namespace {

// The message names the rank, then the communicator aborts every rank.
int fail(const std::string& program, std::ostream& err, const std::string& message, int code) {
  distributed::LaunchInfo info;
  try {
    info = distributed::launch_info();
  } catch (const std::exception&) {
  }
  // One write: the ranks' lines reach the launcher's merged stderr whole.
  err << str_cat(program, ": ", info.world_size > 1 ? str_cat("rank ", info.rank, ": ") : "",
                 message, "\n")
      << std::flush;
  if (info.world_size > 1) {
    try {
      distributed::world().abort(code);
    } catch (const std::exception&) {
    }
  }
  return code;
}

}  // namespace

int run_reporting_failure(const std::string& program, std::ostream& err,
                          const std::function<void()>& body,
                          const std::function<std::string(const FileError&)>& hint) {
  try {
    body();
  } catch (const Stopped& e) {
    distributed::LaunchInfo info;
    try {
      info = distributed::launch_info();
    } catch (const std::exception&) {
    }
    if (info.rank == 0) err << program << ": " << e.what() << "\n" << std::flush;
    return kExitStopped;
  } catch (const FileError& e) {
    const std::string more = hint ? hint(e) : std::string();
    return fail(program, err, more.empty() ? e.what() : std::string(e.what()) + "\n" + more, 1);
  } catch (const std::exception& e) {
    return fail(program, err, e.what(), 1);
  }
  return 0;
}

}  // namespace accrue::train
