// Progress, metrics and formatting (see report.h).
#include "train/report.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <string_view>

#include "optim/strict_json.h"

namespace accrue::train {

std::string fixed_digits(double value, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << value;
  return s.str();
}

std::string evaluation_text(const Evaluation& e) {
  return str_cat(e.label, " ", fixed_digits(e.percent ? 100 * e.value : e.value, e.percent ? 2 : 4),
                 e.percent ? "%" : "");
}

std::string mib(size_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return s.str();
}

nlohmann::json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::optional<double> number_of_json(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  if (j == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (j == "inf") return std::numeric_limits<double>::infinity();
  if (j == "-inf") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  // A device or FIFO takes each record as it comes; a file is written whole at publish(), into
  // a folder checked now rather than when the run is over.
  if (path_.empty()) return;
  if (check_output(path_, "--metrics") == OutputKind::kStream) {
    stream_ = std::make_unique<AtomicFile>(path_);
  }
}

// A metrics log to continue is read whole and held until publish(): far larger than the records
// of any run (a few hundred bytes a step), and small enough to hold twice.
constexpr uint64_t kMaxMetricsBytes = uint64_t(1) << 30;

bool MetricsLog::continue_from(int64_t step, int64_t epochs_done, const std::string& run_id) {
  if (path_.empty() || stream_) return false;
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return false;
  const std::string advice =
      "; the resumed run would lose its records: give --metrics another file";
  std::vector<uint8_t> bytes;
  try {
    bytes = read_file_bytes(path_, kMaxMetricsBytes, "a metrics log to continue");
  } catch (const FileError& e) {
    throw FileError(e.what() + advice);
  }
  const char* const text = reinterpret_cast<const char*>(bytes.data());
  const size_t size = bytes.size();
  std::string kept;
  int64_t last_step = 0;  // of the step records kept
  size_t begin = 0;
  for (int64_t number = 1; begin < size; ++number) {
    const char* newline = static_cast<const char*>(std::memchr(text + begin, '\n', size - begin));
    const size_t end = newline ? static_cast<size_t>(newline - text) : size;
    const std::string_view line(text + begin, end - begin);
    begin = end + 1;
    nlohmann::json record;
    try {
      record = optim::parse_strict_json(line.begin(), line.end());
    } catch (const std::invalid_argument& e) {
      throw FileError(str_cat(path_, ": line ", number, " is not JSON (", e.what(), ")", advice));
    }
    static const nlohmann::json kAbsent;
    const auto field = [&](const char* key) -> const nlohmann::json& {
      return record.is_object() && record.contains(key) ? record.at(key) : kAbsent;
    };
    const nlohmann::json& step_field = field("step");
    if (step_field.is_number_unsigned() &&
        step_field.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      throw FileError(str_cat(path_, ": line ", number, " has step ", step_field.dump(),
                              ", beyond any run", advice));
    }
    if (field("event") == "run" && field("run_id").is_string() && !run_id.empty() &&
        field("run_id") != run_id) {
      throw FileError(str_cat(path_, ": line ", number, " starts run ",
                              optim::brief_json(field("run_id")), ", not the resumed run ", run_id,
                              advice));
    }
    // The end of a run: what follows belongs to no checkpoint this run resumes from.
    const bool ended = field("event") == "summary" || field("event") == "pipeline";
    const bool is_step = step_field.is_number_integer() && !field("event").is_string();
    if (ended || (step_field.is_number_integer() && step_field.get<int64_t>() > step)) break;
    if (is_step) {
      const int64_t s = step_field.get<int64_t>();
      if (last_step != 0 && s != last_step + 1) {
        throw FileError(
            str_cat(path_, ": line ", number, " is step ", s, " after step ", last_step, advice));
      }
      last_step = s;
    }
    const bool unfinished_epoch = field("event") == "epoch" && field("epoch").is_number_integer() &&
                                  field("epoch").get<int64_t>() > epochs_done;
    if (!unfinished_epoch) kept.append(line).push_back('\n');
  }
  if (last_step != 0 && last_step != step) {
    throw FileError(str_cat(path_, ": its step records end at step ", last_step,
                            ", the checkpoint is at step ", step, advice));
  }
  text_ = std::move(kept);
  return true;
}

void MetricsLog::emit(const nlohmann::json& record) {
  if (path_.empty()) return;
  if (stream_) {
    stream_->write(record.dump() + "\n");
  } else {
    text_ += record.dump() + "\n";
  }
}

void MetricsLog::publish() {
  if (path_.empty() || stream_) return;
  AtomicFile out(path_);
  out.write(text_);
  out.commit();
}

void MetricsLog::commit() {
  if (stream_) {
    stream_->commit();
    stream_.reset();
    path_.clear();
  } else {
    publish();
  }
}

uint64_t tensor_hash(const std::vector<nn::NamedTensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (auto& [name, t] : tensors) {
    const Tensor host = t.to(Device::cpu());
    const auto* bytes = static_cast<const unsigned char*>(host.raw());
    for (size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace accrue::train
