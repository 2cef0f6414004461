// Exit statuses and aborting the job (see run.h).
#include "train/run.h"

#include <ostream>

#include "distributed/communicator.h"
#include "train/signals.h"

namespace accrue::train {

std::string printable_line(const std::string& message) {
  std::string line;
  for (const char ch : message) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      line += "\\n";
    } else if (c == '\t') {
      line += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      static const char* digits = "0123456789abcdef";
      line += {'\\', 'x', digits[c >> 4], digits[c & 15]};
    } else {
      line += ch;
    }
  }
  constexpr size_t kHead = 300, kTail = 200;
  if (line.size() <= kHead + kTail + 40) return line;
  return str_cat(line.substr(0, kHead), " [... ", line.size() - kHead - kTail,
                 " characters cut ...] ", line.substr(line.size() - kTail));
}

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
    if (info.rank == 0) err << program << ": " << printable_line(e.what()) << "\n" << std::flush;
    return kExitStopped;
  } catch (const FileError& e) {
    const std::string more = hint ? hint(e) : std::string();
    const std::string what = printable_line(e.what());
    return fail(program, err, more.empty() ? what : what + "\n" + printable_line(more), 1);
  } catch (const std::exception& e) {
    return fail(program, err, printable_line(e.what()), 1);
  }
  return 0;
}

}  // namespace accrue::train
