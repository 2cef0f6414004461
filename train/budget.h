// --memory-budget: the micro-batch chosen from a memory budget. Two probe micro-steps (b and 2b
// samples) measure the activation memory of a micro-step with the allocator's statistics, above
// the baseline that is live before it (parameters, gradients, optimizer state, the data); the
// largest micro-batch that divides the effective batch and whose measured peak fits the budget
// wins, and k follows from --batch. Read next: engine.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace accrue::train {

// "64MiB", "1.5GiB", "512KiB", "1048576" (bytes) -> bytes. Throws ValueError naming the text.
int64_t parse_bytes(const std::string& text);

// "45.06 MiB"
std::string bytes_str(double bytes);

struct BudgetDecision {
  int64_t micro_batch = 0, accum_steps = 0;
  size_t baseline = 0;     // live bytes before a micro-step
  double per_sample = 0;   // activation bytes per sample (the slope between the probes)
  double fixed = 0;        // activation bytes independent of the micro-batch (the intercept)
  size_t chosen_peak = 0;  // the measured activation peak of the chosen micro-batch
  std::string str(int64_t budget, int64_t batch) const;
};

// probe(b) runs one micro-step of b samples and returns its activation peak in bytes (above the
// live bytes before it, which baseline gives). batch: the effective batch per rank (B / world).
// Throws ValueError naming the minimum when one sample does not fit.
BudgetDecision fit_micro_batch(int64_t budget, int64_t batch_per_rank, size_t baseline,
                               const std::function<size_t(int64_t)>& probe);

}  // namespace accrue::train
