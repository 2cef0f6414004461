// The window plan of gradient accumulation. An effective batch B is split over the data-parallel
// ranks and into k micro-batches of b samples on each (B = world_size * k * b); the user gives
// any two of B, b, k and resolve_batch() derives the third. plan_windows() lays an epoch of N
// samples out as windows of micro-batches, each rank taking its contiguous share; a last window
// shorter than B is flushed (and normalised by its own size) or dropped.
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
  // "effective batch 3072 = 8 ranks x micro-batch 32 x 12 accumulation steps"
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
  int64_t samples;  // N of this window over every rank: what its gradient is normalised by
  std::vector<MicroBatch> micro;  // this rank's micro-batches: its contiguous share, in order
  // The most micro-batches any rank has in this window (rank 0's share is the largest): a
  // collective at every micro-step (ZeRO-2's reduce-scatter, ZeRO-3's gathers) runs this many
  // times on every rank, a rank with fewer joining with zeros.
  int64_t most_micro = 0;
  int64_t local_samples() const;  // the sum of micro's counts
};

// Windows covering positions [0, num_samples) in order, as rank `rank` of batch.world_size sees
// them. A full window holds B = world x k x b positions, and rank r takes the r-th contiguous
// share of world x k x b / world, cut into k micro-batches of b. A shorter last window is shared
// as evenly as it goes (the first N mod world ranks take one more) and each share is cut into
// micro-batches of at most b; a rank may get none. With one rank this is k micro-batches of b.
std::vector<Window> plan_windows(int64_t num_samples, const ResolvedBatch& batch,
                                 LastWindow last = LastWindow::kFlush, int rank = 0);

}  // namespace accrue::optim
