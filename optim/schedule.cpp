// Schedule factors and learning-rate scaling rules.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace accrue::optim {

double Schedule::factor(int64_t step) const {
  if (step < warmup_steps) return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == ScheduleKind::kConstant) return 1.0;
  const int64_t span = std::max<int64_t>(total_steps - warmup_steps, 1);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

ScheduleKind Schedule::parse(const std::string& name) {
  if (name == "constant") return ScheduleKind::kConstant;
  if (name == "cosine") return ScheduleKind::kCosine;
  throw ValueError("[schedule] unknown schedule '" + name +
                   "': expected constant or cosine (a warmup applies to either)");
}

const char* schedule_name(ScheduleKind kind) {
  return kind == ScheduleKind::kCosine ? "cosine" : "constant";
}

const char* lr_scaling_name(LrScaling rule) {
  switch (rule) {
    case LrScaling::kLinear:
      return "linear";
    case LrScaling::kSqrt:
      return "sqrt";
    case LrScaling::kNone:
      break;
  }
  return "none";
}

LrScaling parse_lr_scaling(const std::string& name) {
  if (name == "none") return LrScaling::kNone;
  if (name == "linear") return LrScaling::kLinear;
  if (name == "sqrt") return LrScaling::kSqrt;
  throw ValueError("[lr-scaling] unknown rule '" + name + "': expected none, linear, sqrt");
}

double scale_lr(double base_lr, int64_t batch, int64_t base_batch, LrScaling rule) {
  if (base_batch <= 0 || batch <= 0) {
    throw ValueError(str_cat("[scale_lr] batch sizes must be positive, got batch = ", batch,
                             ", base_batch = ", base_batch));
  }
  const double ratio = static_cast<double>(batch) / static_cast<double>(base_batch);
  switch (rule) {
    case LrScaling::kNone:
      return base_lr;
    case LrScaling::kLinear:
      return base_lr * ratio;
    case LrScaling::kSqrt:
      return base_lr * std::sqrt(ratio);
  }
  return base_lr;
}

int64_t AccumSchedule::k_at(int64_t epoch) const {
  int64_t k = points.empty() ? 1 : points.front().second;
  for (const auto& [first, value] : points) {
    if (first <= epoch) k = value;
  }
  return k;
}

std::string AccumSchedule::str() const {
  std::string out;
  for (const auto& [first, k] : points) {
    out += (out.empty() ? "" : ",") + std::to_string(first) + ":" + std::to_string(k);
  }
  return out;
}

AccumSchedule AccumSchedule::parse(const std::string& text, int64_t max_k) {
  AccumSchedule s;
  const auto bad = [&](const std::string& why) {
    return ValueError("--accum-schedule " + text + ": " + why);
  };
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t colon = item.find(':');
    if (colon == std::string::npos) throw bad("'" + item + "' is not epoch:k");
    int64_t values[2];
    const std::string parts[2] = {item.substr(0, colon), item.substr(colon + 1)};
    for (int i = 0; i < 2; ++i) {
      const std::string& p = parts[i];
      if (p.empty() || p.size() > 12 || p.find_first_not_of("0123456789") != std::string::npos) {
        throw bad("'" + item + "' is not epoch:k with positive integers");
      }
      values[i] = std::stoll(p);
    }
    if (values[0] < 1 || values[1] < 1 || values[1] > max_k) {
      throw bad("'" + item + "' needs an epoch >= 1 and k in [1, " + std::to_string(max_k) + "]");
    }
    if (s.points.empty() ? values[0] != 1 : values[0] <= s.points.back().first) {
      throw bad(s.points.empty() ? "the first entry must be for epoch 1"
                                 : "epochs must increase: '" + item + "'");
    }
    s.points.emplace_back(values[0], values[1]);
    at = comma + 1;
  }
  return s;
}

}  // namespace accrue::optim
