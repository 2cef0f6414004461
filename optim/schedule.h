// Learning-rate schedules and batch-size scaling. Schedules are functions of the optimizer-step
// counter only (never of micro-steps), so 40 micro-steps at k = 4 are exactly 10 ticks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace accrue::optim {

// After an optional linear warmup (any kind): constant, or a cosine decay to min_factor.
enum class ScheduleKind { kConstant, kCosine };

struct Schedule {
  ScheduleKind kind = ScheduleKind::kConstant;
  int64_t warmup_steps = 0;  // linear ramp from lr / warmup to lr, before either kind
  int64_t total_steps = 0;   // kCosine: the step at which the decay reaches min_factor
  double min_factor = 0.0;   // kCosine: final lr as a fraction of the base lr

  // The lr multiplier for 0-based optimizer step `step`.
  double factor(int64_t step) const;
  static ScheduleKind parse(const std::string& name);  // constant | cosine
};
const char* schedule_name(ScheduleKind kind);  // what Schedule::parse reads

enum class LrScaling { kNone, kLinear, kSqrt };
LrScaling parse_lr_scaling(const std::string& name);  // none | linear | sqrt
const char* lr_scaling_name(LrScaling rule);          // what parse_lr_scaling reads

// A schedule for the accumulation steps k by epoch, "epoch:k,epoch:k,..." with 1-based epochs
// in increasing order starting at 1: "1:1,2:2,3:4,5:8" runs epoch 1 at k = 1, epoch 2 at 2,
// epochs 3-4 at 4 and every later epoch at 8 (the articles' "accumulation_steps = min(epoch * 2,
// 8)"). The effective batch changes with k; each window is normalised by its own size.
struct AccumSchedule {
  std::vector<std::pair<int64_t, int64_t>> points;  // {first epoch, k}
  int64_t k_at(int64_t epoch) const;                // epoch is 1-based
  std::string str() const;
  // Throws ValueError naming the text and what is wrong.
  static AccumSchedule parse(const std::string& text, int64_t max_k);
};

// base_lr tuned at base_batch, moved to batch: none: unchanged; linear: x batch / base_batch
// (eta * k when only k grows); sqrt: x sqrt(batch / base_batch).
double scale_lr(double base_lr, int64_t batch, int64_t base_batch, LrScaling rule);

}  // namespace accrue::optim
