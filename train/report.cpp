// Progress, metrics and formatting (see report.h).
#include "train/report.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

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

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  // A device or FIFO takes each record as it comes; a file is written whole at publish(), into
  // a folder checked now rather than when the run is over.
  if (path_.empty()) return;
  if (check_output(path_, "--metrics") == OutputKind::kStream) {
    stream_ = std::make_unique<AtomicFile>(path_);
  }
}

bool MetricsLog::continue_from(int64_t step, int64_t epochs_done, const std::string& run_id) {
  if (path_.empty() || stream_) return false;
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return false;
  const std::vector<uint8_t> bytes = read_file_bytes(path_);
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::string line, kept;
  const std::string advice =
      "; the resumed run would lose its records: give --metrics another file";
  int64_t last_step = 0;  // of the step records kept
  for (int64_t number = 1; std::getline(in, line); ++number) {
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      throw FileError(str_cat(path_, ": line ", number, " is not JSON", advice));
    }
    const auto field = [&](const char* key) {
      return record.is_object() && record.contains(key) ? record[key] : nlohmann::json();
    };
    if (field("event") == "run" && field("run_id").is_string() && !run_id.empty() &&
        field("run_id") != run_id) {
      throw FileError(str_cat(path_, ": line ", number, " starts run ",
                              field("run_id").get<std::string>(), ", not the resumed run ", run_id,
                              advice));
    }
    // The end of a run: what follows belongs to no checkpoint this run resumes from.
    const bool ended = field("event") == "summary" || field("event") == "pipeline";
    const bool is_step = field("step").is_number_integer() && !field("event").is_string();
    if (ended || (field("step").is_number_integer() && field("step").get<int64_t>() > step)) break;
    if (is_step) {
      const int64_t s = field("step").get<int64_t>();
      if (last_step != 0 && s != last_step + 1) {
        throw FileError(
            str_cat(path_, ": line ", number, " is step ", s, " after step ", last_step, advice));
      }
      last_step = s;
    }
    const bool unfinished_epoch = field("event") == "epoch" && field("epoch").is_number_integer() &&
                                  field("epoch").get<int64_t>() > epochs_done;
    if (!unfinished_epoch) kept += line + "\n";
  }
  if (last_step != 0 && last_step != step) {
    throw FileError(str_cat(path_, ": its step records end at step ", last_step,
                            ", the checkpoint is at step ", step, advice));
  }
  text_ = kept;
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
