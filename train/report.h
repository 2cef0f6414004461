// What a run reports as it goes: the progress bar or lines, the JSON Lines metrics file, and
// small formatting helpers. Read next: engine.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/file.h"
#include "nn/module.h"
#include "train/task.h"

namespace accrue::train {

// "12.34 MiB"
std::string mib(size_t bytes);
// value with `digits` digits after the point ("8.81")
std::string fixed_digits(double value, int digits);
// An evaluation as the log prints it: "validation PER 12.34%", "loss 0.1234".
std::string evaluation_text(const Evaluation& e);

// A JSON number, or for NaN and infinities the strings "nan", "inf", "-inf" (JSON has no
// non-finite numbers, and null would hide which one it was).
nlohmann::json json_number(double v);
// The number json_number() wrote; none for anything else.
std::optional<double> number_of_json(const nlohmann::json& j);

// The --metrics file: one JSON record a line. A regular file is republished whole (temporary
// and rename) at every publish() -- each checkpoint -- and at commit(), so a run killed by
// SIGKILL or the OOM killer keeps its records up to its last checkpoint; a device or FIFO gets
// each record as it is emitted. A resumed run continues the file: continue_from(step) keeps the
// records of the run up to the checkpoint's step. Without a path (or on ranks other than 0) every
// call does nothing.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path);
  // Keeps the file's records before the first one past `step` and before the end of any run
  // (its summary, and the pipeline record before it), without the records of epochs beyond the
  // first `epochs_done` (a run cut short by --max-steps reports its unfinished epoch; the resumed
  // run reports it whole). Throws FileError naming the file (which is left as it is) when it is
  // not JSON Lines, holds the records of another run (its "run" record names another run_id), or
  // its step records are not consecutive up to `step` (steps missing, or another run's).
  // Returns whether there was a file to continue.
  bool continue_from(int64_t step, int64_t epochs_done, const std::string& run_id);
  void emit(const nlohmann::json& record);
  void publish();
  void commit();

 private:
  std::string path_;
  std::string text_;                    // every record so far (a regular file)
  std::unique_ptr<AtomicFile> stream_;  // a device or FIFO
};

// FNV-1a over the bytes of every tensor, in order (read back to the host).
uint64_t tensor_hash(const std::vector<nn::NamedTensor>& tensors);

}  // namespace accrue::train
