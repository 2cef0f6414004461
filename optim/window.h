// The window plan of gradient accumulation. An effective batch B is split into k micro-batches
// of b samples (B = b * k * world_size); the user gives any two of B, b, k and resolve_batch()
// derives the third. plan_windows() lays an epoch of N samples out as windows of micro-batches;
// a last window shorter than B is flushed (and normalised by its own size) or dropped.
// Read next: accumulator.h, which runs the windows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace accrue::optim {

struct BatchConfig {
  int64_t batch = 0;        // effective batch B; 0: derive it
  int64_t micro_batch = 0;  // b; 0: derive it
  int64_t accum_steps = 0;  // k; 0: derive it
  int64_t world_size = 1;   // data-parallel ranks
};

struct ResolvedBatch {
  int64_t batch, micro_batch, accum_steps, world_size;
  // "effective batch 128 = micro-batch 32 x 4 accumulation steps x 1 rank"
  std::string str() const;
};

// Resolves the missing one of B, b, k; throws ValueError naming the values when fewer than two
// are given, when they disagree, or when B is not divisible as needed.
ResolvedBatch resolve_batch(const BatchConfig& config);

enum class LastWindow { kFlush, kDrop };

struct MicroBatch {
  int64_t start;  // position in the epoch's sample order
  int64_t count;
};

struct Window {
  int64_t start;    // first position
  int64_t samples;  // N of this window: the sum of its micro-batch counts
  std::vector<MicroBatch> micro;
};

// Windows covering positions [0, num_samples) in order. Full windows hold k micro-batches of b;
// a shorter last window holds ceil(rest / b) micro-batches, the last one possibly smaller.
std::vector<Window> plan_windows(int64_t num_samples, const ResolvedBatch& batch,
                                 LastWindow last = LastWindow::kFlush);

}  // namespace accrue::optim
