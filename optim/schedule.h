// Learning-rate schedules and batch-size scaling. Schedules are functions of the optimizer-step
// counter only (never of micro-steps), so 40 micro-steps at k = 4 are exactly 10 ticks.
#pragma once

#include <cstdint>
#include <string>

namespace accrue::optim {

enum class ScheduleKind { kConstant, kWarmup, kCosine };

struct Schedule {
  ScheduleKind kind = ScheduleKind::kConstant;
  int64_t warmup_steps = 0;  // linear ramp from lr / warmup to lr (kWarmup and kCosine)
  int64_t total_steps = 0;   // kCosine: the step at which the decay reaches min_factor
  double min_factor = 0.0;   // kCosine: final lr as a fraction of the base lr

  // The lr multiplier for 0-based optimizer step `step`.
  double factor(int64_t step) const;
  static ScheduleKind parse(const std::string& name);  // constant | warmup | cosine
};

enum class LrScaling { kNone, kLinear, kSqrt };
LrScaling parse_lr_scaling(const std::string& name);  // none | linear | sqrt

// base_lr tuned at base_batch, moved to batch: none: unchanged; linear: x batch / base_batch
// (eta * k when only k grows); sqrt: x sqrt(batch / base_batch).
double scale_lr(double base_lr, int64_t batch, int64_t base_batch, LrScaling rule);

}  // namespace accrue::optim
