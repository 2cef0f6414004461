// Checkpoints of the whole training state, and resuming from them (--checkpoint DIR,
// --checkpoint-every N, --resume DIR). A checkpoint is written at a window boundary as two
// files: step-<N>.safetensors (the master parameters and buffers as "model/<name>", the
// optimizer's moments gathered over every rank, its step counter and loss scaler as
// "optimizer/<name>") and then step-<N>.json (the position — step, skipped steps, epoch and the
// next window — the configuration a resume must match, and the tensor file's size and FNV-1a
// hash). Each is written to a temporary and renamed; the JSON comes last, so a checkpoint
// without its JSON never existed, and the two newest complete checkpoints are kept. The sample
// order of an epoch is a function of (seed, epoch), so the position is all a resume needs to see
// the same samples. Every run has an id, written into each of its checkpoints: a folder holding
// another run's checkpoints is refused unless --resume continues that run, and a run holds a lock
// on its folder (flock on DIR/.lock, released by the kernel even on SIGKILL) while it writes, so
// no two runs prune each other's checkpoints. Read next: engine.cpp.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/module.h"

namespace accrue::train {

// --keep-best's file in the checkpoint folder, outside the newest-two rotation.
constexpr const char* kBestWeights = "best.safetensors";

// The best held-out evaluation so far (--keep-best, --early-stop): its value and step, and the
// evaluations since it; a checkpoint holds it, so a resumed run goes on choosing the same way.
struct BestSoFar {
  bool any = false;
  double value = 0;
  int64_t step = 0;
  int64_t evaluations_since = 0;
  std::string key;  // the measure's (Evaluation::key), e.g. "val_per"
};

struct TrainPosition {
  int64_t step = 0, skipped = 0;  // optimizer steps taken, of which skipped
  int64_t epoch = 0, window = 0;  // the next window to run (0-based)
  // The epoch's windows before `window`: the sum of their mean losses times their items, and
  // their items, so that a run resumed mid-epoch reports the whole epoch's train loss.
  double epoch_loss = 0;
  int64_t epoch_items = 0;
  bool has_epoch_sums = false;  // false in the checkpoints of earlier versions
};

// A new run's id: 16 hex digits from the system's entropy.
std::string new_run_id();

// For --checkpoint before a run starts: throws FileError (naming the flag, the folder and the
// problem) unless dir is a writable folder, or one could be created there, holding no
// checkpoints of a run other than the one `resume` continues (empty: a new run). A run of
// `pipeline` stages writes into dir/stage-N: a folder of a run with another layout (stage
// folders for one without --pipeline, a run's own checkpoints for a pipelined one, more stages)
// is refused, and each stage folder is checked as a folder of its own. per_rank (--zero 3: every
// rank writes dir/rank-<r>-of-<N>, which the engine checks as a folder of its own): a folder
// holding checkpoints of its own is refused; without it, one holding per-rank folders is.
void check_checkpoint_folder(const std::string& dir, const std::string& resume, int pipeline = 1,
                             bool per_rank = false);

// The lock a run holds on its checkpoint folder while it runs (created if missing). Throws
// FileError when another live process holds it. Stale temporaries of killed writers go.
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::string& dir);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  int fd_ = -1;
};

// Writes step-<step>.{safetensors,json} into dir (created if missing) and removes older
// checkpoints of this run beyond the newest two. `flags`: the flags that shaped the run
// (Config::run_flags), for a resume to take; an empty object records none.
void write_checkpoint(const std::string& dir, const std::string& run_id,
                      const nlohmann::json& config, const nlohmann::json& flags,
                      const TrainPosition& position, const BestSoFar& best,
                      const std::vector<nn::NamedTensor>& model_state,
                      const std::vector<nn::NamedTensor>& optimizer_state);

struct Checkpoint {
  std::string path;  // the JSON file
  std::string run_id;
  nlohmann::json config;
  nlohmann::json flags = nlohmann::json::object();  // flag -> its values; empty: none recorded
  TrainPosition position;
  BestSoFar best;
  std::map<std::string, Tensor> model, optimizer;
};

// The newest complete checkpoint in dir. Every field of the JSON is checked (type, range, the
// step in the file name, the tensor file's size and hash, the optimizer's applied steps =
// step - skipped), then `validate` (the caller's checks against its data and plan), which throws
// FileError. Throws FileError naming the file and what is wrong for a truncated or tampered one
// (and which older checkpoint is intact), or when there is none.
Checkpoint read_latest_checkpoint(const std::string& dir,
                                  const std::function<void(const Checkpoint&)>& validate = {});

// The flags recorded in the newest checkpoint of dir (of dir/stage-0 for a pipelined run, of
// dir/rank-0-of-N for a ZeRO-3 run) whose
// description reads as JSON with a well-formed record (an object of non-empty string lists), for
// --resume DIR to take before any data is read (flag -> values); an empty object when that
// checkpoint records none (written before the flags were, or by a run configured in code). A
// damaged newest one is the engine's to name, with the older intact one it resumes from. Throws
// FileError when dir holds no checkpoint, or none whose description can be read.
nlohmann::json recorded_flags(const std::string& dir);
// Throws ValueError (check_compatible's) when the newest readable checkpoint of dir was written
// with other values of `settings` (the task's model settings): for a resume to refuse them before
// it builds the model they describe (an edited flags record could make it huge). A description
// without a config is the engine's to name later.
void check_recorded_settings(const std::string& dir, const nlohmann::json& settings);

// ZeRO-3's per-rank folder under a checkpoint folder: "rank-<r>-of-<N>".
std::string rank_folder(int rank, int ranks);
// The name of a dir/rank-<r>-of-<N> folder that holds checkpoints, rank 0's when there is one;
// "" when none does.
std::string rank_folder_with_checkpoints(const std::string& dir);

// Throws ValueError naming every setting in which the two configurations differ. A key of
// kLaterKeys that `saved` lacks is not compared: checkpoints written before it resume as before.
void check_compatible(const nlohmann::json& saved, const nlohmann::json& current,
                      const std::string& path);
// The resolved settings a checkpoint has held only since resuming took its flags: the device's
// type, the data's hash and a cosine schedule's horizon.
extern const char* const kLaterKeys[3];

// The FNV-1a hash of the files' bytes in order (16 hex digits): the data a run read, so that a
// resume may name the same files elsewhere. Throws FileError naming a file it cannot read.
std::string files_hash(const std::vector<std::string>& paths);

}  // namespace accrue::train
