// Progress, metrics and formatting (see report.h).
#include "train/report.h"

#include <unistd.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace accrue::train {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
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

MetricsLog::MetricsLog(const std::string& path) {
  if (!path.empty()) file_ = std::make_unique<AtomicFile>(path);
}

void MetricsLog::emit(const nlohmann::json& record) {
  if (file_) file_->write(record.dump() + "\n");
}

void MetricsLog::commit() {
  if (file_) file_->commit();
}

Progress::Progress(std::ostream& out, bool quiet, int64_t steps_per_epoch)
    : out_(out),
      quiet_(quiet),
      tty_(isatty(STDOUT_FILENO) && &out == &std::cout),
      every_(std::max<int64_t>(1, steps_per_epoch / 10)),
      total_(steps_per_epoch) {}

void Progress::set_steps_per_epoch(int64_t steps) {
  total_ = steps;
  every_ = std::max<int64_t>(1, steps / 10);
}

void Progress::update(int64_t epoch, int64_t step_in_epoch, int64_t step, double loss,
                      double grad_norm, double lr, double rate) {
  if (quiet_) return;
  if (tty_) {
    if (seconds_since(last_) < 0.1 && step_in_epoch != total_) return;
    last_ = Clock::now();
    const int width = 30;
    const int filled = static_cast<int>(width * step_in_epoch / std::max<int64_t>(total_, 1));
    out_ << "\repoch " << epoch + 1 << " [" << std::string(filled, '=')
         << std::string(width - filled, ' ') << "] " << step_in_epoch << "/" << total_ << " loss "
         << std::fixed << std::setprecision(4) << loss << " " << std::setprecision(0) << rate
         << " samples/s   " << std::flush;
  } else if (step_in_epoch % every_ == 0 || step_in_epoch == total_) {
    out_ << "epoch " << epoch + 1 << " step " << step << " (" << step_in_epoch << "/" << total_
         << ") loss " << std::fixed << std::setprecision(4) << loss << " grad_norm " << grad_norm
         << " lr " << std::scientific << std::setprecision(2) << lr << std::fixed << " "
         << std::setprecision(0) << rate << " samples/s\n";
  }
}

void Progress::end_epoch() {
  if (tty_ && !quiet_) out_ << "\n";
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
