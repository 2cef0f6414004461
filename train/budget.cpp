// The micro-batch from a memory budget (see budget.h).
#include "train/budget.h"

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "train/config.h"

namespace accrue::train {

int64_t parse_bytes(const std::string& text) {
  const auto bad = [&] {
    return ValueError("--memory-budget " + text +
                      ": expected a size in bytes, or with KiB, MiB or GiB (e.g. 64MiB)");
  };
  const size_t used = decimal_prefix(text);
  if (used == 0) throw bad();
  const double value = std::strtod(text.substr(0, used).c_str(), nullptr);
  const std::string unit = text.substr(used);
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KiB") scale = 1024.0;
  if (unit == "MiB") scale = 1024.0 * 1024;
  if (unit == "GiB") scale = 1024.0 * 1024 * 1024;
  if (scale == 0 || !std::isfinite(value)) throw bad();
  const double bytes = value * scale;
  const auto refused = [&](const std::string& why) {
    return ValueError(str_cat("--memory-budget ", text, ": ", why));
  };
  if (!(bytes >= 1)) throw refused("the budget must be at least 1 byte");
  if (bytes != std::floor(bytes)) {
    std::ostringstream exact;  // all the digits: 1024.0001024 is no whole number, "1024" is
    exact << std::setprecision(17) << bytes;
    throw refused(exact.str() + " bytes is not a whole number");
  }
  constexpr double kMostBytes = 9.0e18;  // below int64's largest
  if (bytes > kMostBytes) {
    throw refused(str_cat("more bytes than any machine has (at most ", kMostBytes, ")"));
  }
  return static_cast<int64_t>(bytes);
}

std::string bytes_str(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1 << 20));
  return buf;
}

std::string BudgetDecision::str(int64_t budget, int64_t batch) const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "memory budget %s: baseline %s (parameters, gradients, optimizer state, data), "
                "%.1f KiB of activations per sample + %.1f KiB fixed (measured by two probe "
                "micro-steps) -> micro-batch %lld (its measured activation peak %s), k = %lld for "
                "batch %lld",
                bytes_str(static_cast<double>(budget)).c_str(),
                bytes_str(static_cast<double>(baseline)).c_str(), per_sample / 1024, fixed / 1024,
                static_cast<long long>(micro_batch),
                bytes_str(static_cast<double>(chosen_peak)).c_str(),
                static_cast<long long>(accum_steps), static_cast<long long>(batch));
  return buf;
}

BudgetDecision fit_micro_batch(int64_t budget, int64_t batch_per_rank, size_t baseline,
                               const std::function<size_t(int64_t)>& probe) {
  BudgetDecision d;
  d.baseline = baseline;
  const int64_t b1 = std::max<int64_t>(1, std::min<int64_t>(8, batch_per_rank / 2));
  const double p1 = static_cast<double>(probe(b1)), p2 = static_cast<double>(probe(2 * b1));
  d.per_sample = std::max((p2 - p1) / static_cast<double>(b1), 1.0);
  d.fixed = std::max(p1 - d.per_sample * static_cast<double>(b1), 0.0);
  const double room = static_cast<double>(budget) - static_cast<double>(baseline) - d.fixed;
  const double minimum = static_cast<double>(baseline) + d.fixed + d.per_sample;
  if (room < d.per_sample) {
    throw ValueError(str_cat("--memory-budget ", bytes_str(static_cast<double>(budget)),
                             " is below what one sample needs: ", bytes_str(minimum), " (baseline ",
                             bytes_str(static_cast<double>(baseline)), " + ",
                             std::lround(d.fixed + d.per_sample), " bytes of activations)"));
  }
  const int64_t largest = static_cast<int64_t>(std::floor(room / d.per_sample));
  // The largest divisor of the per-rank batch that fits; checked by one more probe (the line
  // through two points may flatter a size), stepping down while it does not fit.
  for (int64_t b = std::min(largest, batch_per_rank); b >= 1; --b) {
    if (batch_per_rank % b != 0) continue;
    const size_t peak = probe(b);
    if (baseline + peak <= static_cast<size_t>(budget)) {
      d.micro_batch = b;
      d.accum_steps = batch_per_rank / b;
      d.chosen_peak = peak;
      return d;
    }
  }
  throw ValueError(str_cat("--memory-budget ", bytes_str(static_cast<double>(budget)),
                           " is below what one sample needs: ", bytes_str(minimum)));
}

}  // namespace accrue::train
