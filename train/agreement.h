// Ranks that disagree are stopped before they train. Launched by hand (`mpirun -np 1 prog A :
// -np 1 prog B`) or from a stale script, the ranks of one job can start with different settings:
// a different model width crashes inside the first all-reduce, a different sample count leaves
// one rank waiting forever, a different --lr or --seed trains diverged replicas and exits 0. At
// start-up every rank hashes each of its resolved settings (what may differ per rank -- threads,
// output paths, quiet, the local device -- is left out by the caller), all-gathers the hashes
// once, and throws naming the first setting that differs and the ranks. Read next: engine.cpp.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace accrue::train {

// Throws ValueError "the ranks disagree on <key>: rank R differs from rank 0 (this rank has V)"
// for the first key (in the object's order) whose value is not the same on every rank. A
// collective: every rank calls it at the same point. Nothing happens on one rank.
void check_ranks_agree(distributed::Communicator& comm, const nlohmann::ordered_json& settings);

// Every rank's `value`, in rank order (one all-gather). Collective.
std::vector<int64_t> gather_from_ranks(distributed::Communicator& comm, int64_t value);

// After a resume: throws FileError naming both steps when a rank (`who`: "stage", "rank") read
// another step than this one. Where each rank read its own newest checkpoint (pipeline stages,
// ZeRO-3's shards, `per_rank`), a rank stopped while writing leaves one fewer; where every rank
// reads the one folder rank 0 wrote, the ranks were given different folders (an MPMD launch, or
// a copy per node that went stale), and would train diverged replicas. Collective.
void check_same_resume_step(distributed::Communicator& comm, int64_t step,
                            const std::string& resume, const char* who, bool per_rank);

}  // namespace accrue::train
