// Schedule factors and learning-rate scaling rules.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace accrue::optim {

double Schedule::factor(int64_t step) const {
  if (kind == ScheduleKind::kConstant) return 1.0;
  if (step < warmup_steps) return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == ScheduleKind::kWarmup) return 1.0;
  const int64_t span = std::max<int64_t>(total_steps - warmup_steps, 1);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

ScheduleKind Schedule::parse(const std::string& name) {
  if (name == "constant") return ScheduleKind::kConstant;
  if (name == "warmup") return ScheduleKind::kWarmup;
  if (name == "cosine") return ScheduleKind::kCosine;
  throw ValueError("[schedule] unknown schedule '" + name + "': expected constant, warmup, cosine");
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

}  // namespace accrue::optim
