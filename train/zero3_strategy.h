// --zero 3 as a strategy: the model's layers (Task::layers) become the units of
// distributed/zero3.h, each rank's arena holds its slice of every unit, and the strategy runs
// each window's micro-batches itself, layer by layer, gathering each layer around its forward
// and its backward (the engine's micro-step calls the model whole). Checkpoints are per rank
// (DIR/rank-<r>-of-<N>): a resume needs the same ranks. Read next: strategies.h.
#pragma once

#include <memory>

#include "train/strategy.h"

namespace accrue::train {

std::shared_ptr<Strategy> make_zero_stage_three(const StrategyContext& ctx);

}  // namespace accrue::train
