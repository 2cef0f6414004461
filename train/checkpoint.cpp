// Training-state checkpoints (see checkpoint.h).
#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>

#include "core/file.h"
#include "kernels/factories.h"
#include "optim/safetensors.h"
#include "optim/strict_json.h"
#include "train/report.h"

namespace accrue::train {

namespace fs = std::filesystem;

namespace {

// A checkpoint's description is a few KiB (the run's configuration and position); a file far
// larger is not one, and is refused before it is read.
constexpr uint64_t kMaxDescriptionBytes = 16 << 20;
constexpr const char* kDescription = "a checkpoint description";

// FNV-1a from the start value checkpoints have always used (the offset basis short of a digit).
constexpr uint64_t kFnvStart = 1469598103934665603ull;
uint64_t fnv1a(uint64_t h, const void* bytes, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(bytes)[i]) * 1099511628211ull;
  return h;
}

std::string hex16(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string fnv1a_hex(const std::vector<uint8_t>& bytes) {
  return hex16(fnv1a(kFnvStart, bytes.data(), bytes.size()));
}

std::string stem(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%010lld", static_cast<long long>(step));
  return buf;
}

// The steps of the checkpoints whose JSON exists in dir, newest first.
std::vector<int64_t> listed_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return steps;
  fs::directory_iterator entries(dir, ec);
  if (ec) throw FileError(str_cat(dir, ": cannot list the checkpoints (", ec.message(), ")"));
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    long long step = 0;
    char tail[8] = {};
    if (std::sscanf(name.c_str(), "step-%lld.%7s", &step, tail) == 2 &&
        std::string(tail) == "json" && name == stem(step) + ".json") {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// A field of a checkpoint's JSON as an integer in [low, high]: anything else (a string, a
// fraction, 1e30, a negative step) throws FileError naming the file and the field.
int64_t integer_field(const nlohmann::json& j, const char* key, int64_t low, int64_t high,
                      const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end()) throw FileError(str_cat(path, ": '", key, "' is missing"));
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    throw FileError(str_cat(path, ": '", key, "' is ", optim::brief_json(*it), ", not an integer"));
  }
  const int64_t v = it->get<int64_t>();
  if (v < low || v > high) {
    throw FileError(str_cat(path, ": '", key, "' is ", v, ", outside [", low, ", ", high, "]"));
  }
  return v;
}

std::string string_field(const nlohmann::json& j, const char* key, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    throw FileError(str_cat(path, ": '", key, "' is ",
                            it == j.end() ? "missing" : optim::brief_json(*it), ", not a string"));
  }
  return it->get<std::string>();
}

// A checkpoint's record of the flags: an object whose every value is a list of strings.
nlohmann::json flags_field(const nlohmann::json& flags, const std::string& path) {
  bool valid = flags.is_object();
  for (auto it = flags.begin(); valid && it != flags.end(); ++it) {
    valid =
        it->is_array() && !it->empty() &&
        std::all_of(it->begin(), it->end(), [](const nlohmann::json& v) { return v.is_string(); });
  }
  if (!valid) {
    throw FileError(str_cat(path, ": 'flags' is ", optim::brief_json(flags),
                            ", not an object of non-empty string lists"));
  }
  return flags;
}

// The run id in a checkpoint's JSON ("" when unreadable or absent: an older format).
std::string run_id_of(const std::string& json_path) {
  try {
    const std::vector<uint8_t> text =
        read_file_bytes(json_path, kMaxDescriptionBytes, kDescription);
    const auto j = optim::parse_strict_json(text.begin(), text.end());
    const auto it = j.find("run_id");
    return it != j.end() && it->is_string() ? it->get<std::string>() : "";
  } catch (const std::exception&) {
    return "";
  }
}

// A checkpoint is written after an applied step, whose weights and moments are finite (a step
// with a non-finite gradient is skipped) and whose second moments are sums of squares: a value
// outside that was not written by a run, and would spoil the next one.
void check_saved_values(const std::string& name, const Tensor& t, const std::string& path) {
  if (const auto bad = optim::first_nonfinite(t)) {
    throw FileError(
        str_cat(path, ": tensor '", name, "' holds ", bad->value, " at element ", bad->index));
  }
  if (name.find("exp_avg_sq") != std::string::npos && is_floating(t.dtype())) {
    const Tensor values = to_dtype(t, DType::kFloat64);
    const double* v = values.data<double>();
    const double* negative = std::find_if(v, v + t.numel(), [](double x) { return x < 0; });
    if (negative != v + t.numel()) {
      throw FileError(str_cat(path, ": tensor '", name, "' holds ", *negative, " at element ",
                              negative - v, ", but second moments are not negative"));
    }
  }
}

// Reads one checkpoint; throws FileError naming its file and the problem.
Checkpoint read_checkpoint(const std::string& dir, int64_t step,
                           const std::function<void(const Checkpoint&)>& validate) {
  Checkpoint c;
  c.path = (fs::path(dir) / (stem(step) + ".json")).string();
  const std::vector<uint8_t> text = read_file_bytes(c.path, kMaxDescriptionBytes, kDescription);
  nlohmann::json j;
  try {
    j = optim::parse_strict_json(text.begin(), text.end());
  } catch (const std::exception& e) {
    throw FileError(c.path + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw FileError(c.path + ": not a checkpoint description (not an object)");
  if (string_field(j, "format", c.path) != "accrue-checkpoint-1") {
    throw FileError(str_cat(c.path, ": format ", optim::brief_json(j["format"]),
                            ", expected \"accrue-checkpoint-1\""));
  }
  c.run_id = j.contains("run_id") ? string_field(j, "run_id", c.path) : "";
  const auto config = j.find("config");
  if (config == j.end() || !config->is_object()) {
    throw FileError(c.path + ": 'config' is missing or not an object");
  }
  c.config = *config;
  if (j.contains("flags")) c.flags = flags_field(j["flags"], c.path);
  const auto position = j.find("position");
  if (position == j.end() || !position->is_object()) {
    throw FileError(c.path + ": 'position' is missing or not an object");
  }
  const std::string at = c.path + " position";
  c.position.step = integer_field(*position, "step", step, step, at);  // the file's own step
  c.position.skipped = integer_field(*position, "skipped", 0, c.position.step, at);
  c.position.epoch = integer_field(*position, "epoch", 0, INT32_MAX, at);
  c.position.window = integer_field(*position, "window", 0, INT32_MAX, at);
  // Absent from the checkpoints of earlier versions: their resumed epoch reports its own windows.
  if (position->contains("epoch_items")) {
    c.position.epoch_items = integer_field(*position, "epoch_items", 0, INT64_MAX, at);
    const auto loss = position->find("epoch_loss");
    const std::optional<double> value =
        loss == position->end() ? std::nullopt : number_of_json(*loss);
    if (!value || (c.position.window == 0 && (c.position.epoch_items != 0 || *value != 0))) {
      throw FileError(str_cat(at, ": 'epoch_loss' is ",
                              loss == position->end() ? "missing" : optim::brief_json(*loss),
                              " beside 'epoch_items' ", c.position.epoch_items,
                              " (a number, or \"nan\", \"inf\" or \"-inf\" when a step's loss "
                              "was; both 0 at an epoch's first window)"));
    }
    c.position.epoch_loss = *value;
    c.position.has_epoch_sums = true;
  }
  if (j.contains("best")) {
    const nlohmann::json& best = j["best"];
    const std::string in = c.path + " best";
    if (!best.is_object() || !best.contains("value") || !best["value"].is_number() ||
        !std::isfinite(best["value"].get<double>())) {
      throw FileError(str_cat(in, ": ", optim::brief_json(best),
                              " is not {value: a finite number, step, evaluations_since}"));
    }
    c.best = {true, best["value"].get<double>(),
              integer_field(best, "step", 0, c.position.step, in),
              integer_field(best, "evaluations_since", 0, c.position.step, in),
              string_field(best, "key", in)};
  }
  const std::string tensors_name = string_field(j, "tensors", c.path);
  if (tensors_name != stem(step) + ".safetensors") {
    throw FileError(str_cat(c.path, ": 'tensors' is \"", tensors_name, "\", expected \"",
                            stem(step), ".safetensors\""));
  }
  const int64_t expected_bytes = integer_field(j, "bytes", 0, INT64_MAX, c.path);
  const std::string expected_hash = string_field(j, "fnv1a", c.path);
  const std::string tensors = (fs::path(dir) / tensors_name).string();
  const RegularFile tensor_file(tensors);
  if (static_cast<int64_t>(tensor_file.size()) != expected_bytes) {
    throw FileError(str_cat(tensors, ": ", tensor_file.size(), " bytes, but ", c.path, " says ",
                            expected_bytes, " (truncated or replaced)"));
  }
  const std::vector<uint8_t> bytes = tensor_file.read(0, tensor_file.size());
  if (fnv1a_hex(bytes) != expected_hash) {
    throw FileError(str_cat(tensors, ": its contents do not match the hash in ", c.path,
                            " (modified after it was written)"));
  }
  for (auto& [name, t] : optim::read_safetensors(tensors)) {
    check_saved_values(name, t, tensors);
    if (name.rfind("model/", 0) == 0) {
      c.model.emplace(name.substr(6), t);
    } else if (name.rfind("optimizer/", 0) == 0) {
      c.optimizer.emplace(name.substr(10), t);
    } else {
      throw FileError(
          str_cat(tensors, ": tensor '", name, "' belongs to neither the model nor the optimizer"));
    }
  }
  // The optimizer counts the updates it applied: every step that was not skipped.
  const auto applied = c.optimizer.find("steps");
  if (applied == c.optimizer.end() || applied->second.numel() != 1 ||
      applied->second.dtype() != DType::kInt32) {
    throw FileError(str_cat(tensors, ": 'optimizer/steps' is ",
                            applied == c.optimizer.end() ? "missing" : applied->second.describe(),
                            ", not one int32"));
  }
  if (static_cast<int64_t>(applied->second.item()) != c.position.step - c.position.skipped) {
    throw FileError(str_cat(c.path, ": step ", c.position.step, " with ", c.position.skipped,
                            " skipped, but the optimizer in ", tensors_name, " applied ",
                            static_cast<int64_t>(applied->second.item()), " updates"));
  }
  if (validate) validate(c);
  return c;
}

}  // namespace

std::string new_run_id() {
  std::random_device entropy;
  const uint64_t id = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

namespace {

// One folder of checkpoints (a run's, or one pipeline stage's): `flag` names it in messages and
// `advice` is the folder a --resume of its run names.
void check_one_folder(const std::string& dir, const std::string& resume, const std::string& flag,
                      const std::string& advice) {
  if (dir.empty()) throw FileError("--checkpoint: the path is empty");
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (ec && status.type() != fs::file_type::not_found) {
    throw FileError(str_cat(flag, ": ", ec.message()));
  }
  if (status.type() == fs::file_type::not_found && fs::is_symlink(fs::symlink_status(dir, ec))) {
    throw FileError(str_cat(flag, ": is a symbolic link to nothing (",
                            fs::read_symlink(dir, ec).string(),
                            "): create its target or name the folder itself"));
  }
  if (status.type() == fs::file_type::not_found) {
    // Created at the start: the nearest existing ancestor must be a writable folder.
    fs::path up = fs::path(dir).parent_path();
    while (!up.empty() && !fs::exists(up, ec)) up = up.parent_path();
    const std::string folder = up.empty() ? "." : up.string();
    if (!fs::is_directory(folder, ec)) {
      throw FileError(str_cat(flag, ": cannot create it: ", folder, " is not a folder"));
    }
    if (::access(folder.c_str(), W_OK | X_OK) != 0) {
      throw FileError(str_cat(flag, ": cannot create it in ", folder, ": ", std::strerror(errno)));
    }
    return;
  }
  if (status.type() != fs::file_type::directory) {
    throw FileError(str_cat(flag, ": exists and is not a folder"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw FileError(str_cat(flag, ": cannot write into it: ", std::strerror(errno)));
  }
  const std::vector<int64_t> steps = listed_steps(dir);
  if (steps.empty()) return;
  // Resuming into the folder itself: whatever is wrong with its checkpoints, the resume says.
  if (!resume.empty() && fs::equivalent(dir, resume, ec)) return;
  std::string continued;  // the run --resume continues: the id of its newest readable checkpoint
  int64_t resumed_step = -1;
  if (!resume.empty()) {
    for (int64_t step : listed_steps(resume)) {
      continued = run_id_of((fs::path(resume) / (stem(step) + ".json")).string());
      if (resumed_step < 0) resumed_step = step;
      if (!continued.empty()) break;
    }
  }
  if (!continued.empty() && steps.front() > resumed_step &&
      run_id_of((fs::path(dir) / (stem(steps.front()) + ".json")).string()) == continued) {
    throw FileError(
        str_cat(flag, ": holds a later checkpoint of the same run (", stem(steps.front()),
                ") than --resume ", resume, " (", stem(resumed_step),
                "): the new ones would be pruned; resume from it or choose another folder"));
  }
  for (int64_t step : steps) {
    const std::string json = (fs::path(dir) / (stem(step) + ".json")).string();
    const std::string id = run_id_of(json);
    if (continued.empty() || id != continued) {
      throw FileError(str_cat(flag, ": holds checkpoints of another run (", stem(step),
                              ".json, run id ", id.empty() ? "unknown" : id,
                              "): continue that run with --resume ", advice,
                              ", or choose another folder"));
    }
  }
}

// The stages N of dir/stage-N folders that hold checkpoints (a pipelined run's), in order.
std::vector<int> stages_with_checkpoints(const std::string& dir) {
  std::vector<int> stages;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    int stage = -1;
    char tail = 0;
    const std::string name = entry.path().filename().string();
    if (std::sscanf(name.c_str(), "stage-%d%c", &stage, &tail) == 1 && stage >= 0 &&
        name == "stage-" + std::to_string(stage) && !listed_steps(entry.path().string()).empty()) {
      stages.push_back(stage);
    }
  }
  std::sort(stages.begin(), stages.end());
  return stages;
}

}  // namespace

std::string rank_folder(int rank, int ranks) {
  return str_cat("rank-", rank, "-of-", ranks);
}

std::string rank_folder_with_checkpoints(const std::string& dir) {
  std::error_code ec;
  std::string found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    int rank = -1, ranks = -1;
    char tail = 0;
    const std::string name = entry.path().filename().string();
    if (std::sscanf(name.c_str(), "rank-%d-of-%d%c", &rank, &ranks, &tail) == 2 && rank >= 0 &&
        rank < ranks && name == rank_folder(rank, ranks) &&
        !listed_steps(entry.path().string()).empty() && (found.empty() || rank == 0)) {
      found = name;
    }
  }
  return found;
}

void check_checkpoint_folder(const std::string& dir, const std::string& resume, int pipeline,
                             bool per_rank) {
  const std::string flag = "--checkpoint " + dir;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    const std::string ranks = rank_folder_with_checkpoints(dir);
    if (!per_rank && !ranks.empty()) {
      throw FileError(str_cat(flag, ": holds a ZeRO-3 run's per-rank checkpoints (", ranks,
                              "): continue it with --resume ", dir, ", or choose another folder"));
    }
    if (per_rank && !listed_steps(dir).empty()) {
      throw FileError(str_cat(flag,
                              ": holds the checkpoints of a run without --zero 3; this run "
                              "writes one per rank: choose another folder"));
    }
  }
  if (pipeline > 1 && fs::is_directory(dir, ec) && !listed_steps(dir).empty()) {
    throw FileError(str_cat(flag,
                            ": holds the checkpoints of a run without --pipeline; this run "
                            "has --pipeline ",
                            pipeline, ": choose another folder"));
  }
  check_one_folder(dir, resume, flag, dir);
  if (!fs::is_directory(dir, ec)) return;
  const std::vector<int> stages = stages_with_checkpoints(dir);
  if (pipeline == 1) {
    if (!stages.empty()) {
      throw FileError(str_cat(flag, ": holds a pipelined run's checkpoints (stage-", stages.front(),
                              "): continue it with --resume ", dir, ", or choose another folder"));
    }
    return;
  }
  for (int stage : stages) {
    const std::string name = "stage-" + std::to_string(stage);
    if (stage >= pipeline) {
      throw FileError(str_cat(flag, ": holds checkpoints of pipeline stage ", stage,
                              " (a run of more stages than --pipeline ", pipeline,
                              "): choose another folder"));
    }
    check_one_folder((fs::path(dir) / name).string(),
                     resume.empty() ? "" : (fs::path(resume) / name).string(),
                     str_cat(flag, " (its ", name, ")"), dir);
  }
}

CheckpointLock::CheckpointLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw FileError(str_cat("--checkpoint ", dir, ": cannot create it (", ec.message(), ")"));
  const std::string lock = (fs::path(dir) / ".lock").string();
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw FileError(str_cat(lock, ": cannot open the lock file: ", std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw FileError(err == EWOULDBLOCK
                        ? str_cat("--checkpoint ", dir, ": another run is writing into it (", lock,
                                  " is locked)")
                        : str_cat(lock, ": cannot lock it: ", std::strerror(err)));
  }
  // Nobody else writes here now: the temporaries of checkpoint files are what a killed writer
  // left; nothing else is touched.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    long long step = 0;
    if (std::sscanf(name.c_str(), "step-%lld", &step) != 1) continue;
    for (const char* kind : {".json", ".safetensors"}) {
      if (is_temporary_of(name, stem(step) + kind)) fs::remove(entry.path(), ec);
    }
  }
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

void write_checkpoint(const std::string& dir, const std::string& run_id,
                      const nlohmann::json& config, const nlohmann::json& flags,
                      const TrainPosition& position, const BestSoFar& best,
                      const std::vector<nn::NamedTensor>& model_state,
                      const std::vector<nn::NamedTensor>& optimizer_state) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw FileError(str_cat("--checkpoint ", dir, ": cannot create it (", ec.message(), ")"));
  std::vector<nn::NamedTensor> all;
  for (const auto& [name, t] : model_state) all.emplace_back("model/" + name, t);
  for (const auto& [name, t] : optimizer_state) all.emplace_back("optimizer/" + name, t);
  const std::string name = stem(position.step);
  const std::string tensors = (fs::path(dir) / (name + ".safetensors")).string();
  optim::save_safetensors(tensors, all, {{"format", "pt"}});
  const std::vector<uint8_t> bytes = read_file_bytes(tensors);
  nlohmann::json j;
  j["format"] = "accrue-checkpoint-1";
  j["run_id"] = run_id;
  j["tensors"] = name + ".safetensors";
  j["bytes"] = bytes.size();
  j["fnv1a"] = fnv1a_hex(bytes);
  j["config"] = config;
  if (!flags.empty()) j["flags"] = flags;
  j["position"] = {{"step", position.step},
                   {"skipped", position.skipped},
                   {"epoch", position.epoch},
                   {"window", position.window},
                   // A skipped step's loss may be NaN or infinite, and the sum with it.
                   {"epoch_loss", json_number(position.epoch_loss)},
                   {"epoch_items", position.epoch_items}};
  if (best.any) {
    j["best"] = {{"key", best.key},
                 {"value", best.value},
                 {"step", best.step},
                 {"evaluations_since", best.evaluations_since}};
  }
  AtomicFile out((fs::path(dir) / (name + ".json")).string());
  out.write(j.dump(2) + "\n");
  out.commit();
  // Keep the newest two complete checkpoints.
  const std::vector<int64_t> steps = listed_steps(dir);
  for (size_t i = 2; i < steps.size(); ++i) {
    fs::remove(fs::path(dir) / (stem(steps[i]) + ".json"), ec);
    fs::remove(fs::path(dir) / (stem(steps[i]) + ".safetensors"), ec);
  }
}

Checkpoint read_latest_checkpoint(const std::string& dir,
                                  const std::function<void(const Checkpoint&)>& validate) {
  const std::vector<int64_t> steps = listed_steps(dir);
  if (steps.empty()) {
    throw FileError("--resume " + dir + ": no checkpoint (step-*.json) in it");
  }
  try {
    return read_checkpoint(dir, steps.front(), validate);
  } catch (const FileError& e) {
    std::string older;
    for (size_t i = 1; i < steps.size() && older.empty(); ++i) {
      try {
        read_checkpoint(dir, steps[i], validate);
        older = stem(steps[i]);
      } catch (const FileError&) {
      }
    }
    throw FileError(std::string(e.what()) +
                    (older.empty() ? "; no older intact checkpoint"
                                   : "; " + older + " is intact: remove " + stem(steps.front()) +
                                         ".json to resume from it"));
  }
}

namespace {

// The newest checkpoint description of dir (of dir/stage-0, of a ZeRO-3 rank folder) that reads
// as JSON and that `check` (throwing FileError) accepts, and its path. A damaged newest one is
// passed over here: the engine names it, and the older checkpoint it resumes from. When none
// can be read, that is said now.
std::pair<std::string, nlohmann::json> newest_description(
    const std::string& dir,
    const std::function<void(const std::string& path, const nlohmann::json& j)>& check) {
  std::string folder = dir;
  std::error_code ec;
  if (listed_steps(folder).empty() && fs::is_directory(fs::path(dir) / "stage-0", ec)) {
    folder = (fs::path(dir) / "stage-0").string();
  }
  if (listed_steps(folder).empty() && fs::is_directory(dir, ec)) {  // a ZeRO-3 run's
    const std::string ranks = rank_folder_with_checkpoints(dir);
    if (!ranks.empty()) folder = (fs::path(dir) / ranks).string();
  }
  const std::vector<int64_t> steps = listed_steps(folder);
  if (steps.empty()) throw FileError("--resume " + dir + ": no checkpoint (step-*.json) in it");
  std::string damage;
  for (int64_t step : steps) {
    const std::string path = (fs::path(folder) / (stem(step) + ".json")).string();
    try {
      const std::vector<uint8_t> text = read_file_bytes(path, kMaxDescriptionBytes, kDescription);
      nlohmann::json j;
      try {
        j = optim::parse_strict_json(text.begin(), text.end());
      } catch (const std::exception& e) {
        throw FileError(path + ": not JSON (" + e.what() + ")");
      }
      check(path, j);
      return {path, std::move(j)};
    } catch (const FileError& e) {
      if (damage.empty()) damage = e.what();
    }
  }
  throw FileError(damage + "; no older intact checkpoint");
}

// The description's flags record, checked (an empty object when it has none).
nlohmann::json flags_of(const std::string& path, const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("flags")) return nlohmann::json::object();
  return flags_field(j["flags"], path);
}

}  // namespace

nlohmann::json recorded_flags(const std::string& dir) {
  const auto [path, j] = newest_description(dir, flags_of);
  return flags_of(path, j);
}

void check_recorded_settings(const std::string& dir, const nlohmann::json& settings) {
  // The description recorded_flags() took the flags from.
  const auto [path, j] = newest_description(dir, flags_of);
  if (!j.is_object() || !j.contains("config") || !j["config"].is_object()) return;
  check_compatible(j["config"], settings, path);
}

const char* const kLaterKeys[3] = {"device_type", "data_hash", "horizon"};

void check_compatible(const nlohmann::json& saved, const nlohmann::json& current,
                      const std::string& path) {
  std::string differences;
  for (auto it = current.begin(); it != current.end(); ++it) {
    const auto other = saved.find(it.key());
    if (other == saved.end() &&
        std::find(std::begin(kLaterKeys), std::end(kLaterKeys), it.key()) != std::end(kLaterKeys)) {
      continue;
    }
    if (other == saved.end() || *other != it.value()) {
      differences += str_cat(differences.empty() ? "" : "; ", it.key(), " = ",
                             other == saved.end() ? "(absent)" : optim::brief_json(*other),
                             ", this run has ", optim::brief_json(it.value()));
    }
  }
  if (!differences.empty()) {
    throw ValueError(str_cat("--resume: ", path, " was written with ", differences));
  }
}

std::string files_hash(const std::vector<std::string>& paths) {
  uint64_t h = kFnvStart;
  std::vector<char> chunk(1 << 20);
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw FileError(str_cat(path, ": cannot read it to hash the data: ", std::strerror(errno)));
    while (in) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      h = fnv1a(h, chunk.data(), static_cast<size_t>(in.gcount()));
    }
    if (in.bad()) throw FileError(str_cat(path, ": a read error while hashing the data"));
  }
  return hex16(h);
}

}  // namespace accrue::train
