// One all-gather of per-setting hashes (see agreement.h).
#include "train/agreement.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace accrue::train {

namespace {

// Hashes per rank: slot 0 the number of settings, then one per setting; settings beyond the
// last slot share it.
constexpr int64_t kSlots = 128;

int32_t fnv1a32(const std::string& text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) h = (h ^ c) * 16777619u;
  return static_cast<int32_t>(h);
}

}  // namespace

void check_ranks_agree(distributed::Communicator& comm, const nlohmann::ordered_json& settings) {
  const int ranks = comm.world_size();
  if (ranks == 1) return;
  std::vector<std::string> keys;
  std::vector<int32_t> mine(kSlots, 0);
  mine[0] = static_cast<int32_t>(settings.size());
  int64_t slot = 1;
  for (auto it = settings.begin(); it != settings.end(); ++it) {
    keys.push_back(it.key());
    const int64_t at = std::min(slot++, kSlots - 1);
    mine[at] = fnv1a32(std::to_string(mine[at]) + it.key() + "=" + it.value().dump());
  }
  const Tensor local = Tensor::from_vector<int32_t>({kSlots}, mine);
  Tensor all = Tensor::empty({ranks * kSlots}, DType::kInt32);
  comm.all_gather(local, all);
  const int32_t* row = all.data<int32_t>();
  for (int r = 1; r < ranks; ++r) {
    const int32_t* other = row + r * kSlots;
    if (other[0] != row[0]) {
      throw ValueError(str_cat("the ranks disagree on their settings: rank ", r, " has ", other[0],
                               ", rank 0 has ", row[0], " (different programs?)"));
    }
    for (int64_t s = 1; s < kSlots; ++s) {
      if (other[s] == row[s]) continue;
      const size_t first = static_cast<size_t>(s - 1);
      std::string key = first < keys.size() ? keys[first] : "?";
      if (s == kSlots - 1 && keys.size() > static_cast<size_t>(kSlots - 1)) {
        key = "one of the settings from " + key + " on";
      }
      throw ValueError(str_cat("the ranks disagree on ", key, ": rank ", r,
                               " differs from rank 0 (this rank, ", comm.rank(), ", has ",
                               first < keys.size() ? settings[keys[first]].dump() : "?", ")"));
    }
  }
}

std::vector<int64_t> gather_from_ranks(distributed::Communicator& comm, int64_t value) {
  const Tensor mine = Tensor::from_vector<int64_t>({1}, {value});
  Tensor all = Tensor::zeros({comm.world_size()}, DType::kInt64);
  comm.all_gather(mine, all);
  return all.to_vector<int64_t>();
}

void check_same_resume_step(distributed::Communicator& comm, int64_t step,
                            const std::string& resume, const char* who, bool per_rank) {
  if (comm.world_size() == 1) return;
  const std::vector<int64_t> steps = gather_from_ranks(comm, step);
  for (size_t r = 0; r < steps.size(); ++r) {
    if (steps[r] == step) continue;
    const std::string what = str_cat("--resume ", resume, ": the ", who,
                                     "s' newest complete checkpoints are at different steps (rank ",
                                     comm.rank(), ": ", step, ", rank ", r, ": ", steps[r], "); ");
    if (per_rank) {
      throw FileError(str_cat(what, "a ", who, " stopped while writing: remove the newer step-",
                              std::max(step, steps[r]), " files to resume from the step every ",
                              who, " has"));
    }
    throw FileError(str_cat(what, "every ", who,
                            " resumes from the one checkpoint rank 0 wrote: give each the same "
                            "folder (a shared file system, or identical copies)"));
  }
}

}  // namespace accrue::train
